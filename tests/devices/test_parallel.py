"""Tensor and Ulysses sequence parallelism: 2 gloo processes on the CPU against one process.

One pair of workers (``torch.multiprocessing`` "spawn", joined through ``parallel.init_distributed`` with the
environment torchrun sets) runs every case and writes its latents and what it held and read as files; the
tests compare them with ``sample`` in this process on the same files. The workers import no diffusers: the
tiny files are written from the product's own module with seeded random weights (BFL layout, a diffusers
layout renamed here, fp8, int8 with ConvRot, nvfp4).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from quant_files import write_quantised, write_with_kitchen
from safetensors.torch import load_file, save_file

from flux2_core.configs import Flux2Config
from flux2_core.devices.parallel import (
    broadcast_conditioning,
    broadcast_references,
    check_world,
    close_distributed,
    held_bytes,
    init_distributed,
    parallel_info,
    tensor_plan,
)
from flux2_core.devices.parallel_load import load_transformer_parallel, planned_weight_bytes
from flux2_core.dit.files import DIT_SPEC, load_transformer
from flux2_core.dit.step_cache import StepCache
from flux2_core.dit.transformer import Flux2Transformer
from flux2_core.errors import Flux2Error
from flux2_core.lora import prepare_lora, read_lora
from flux2_core.ops import linears
from flux2_core.references import ReferenceLatents
from flux2_core.sampling import SampleRequest, SampleSettings, sample
from flux2_core.steering.reference_strength import ReferenceStrength
from flux2_core.steering.regions import Region, RegionalPrompt
from flux2_core.weights.checkpoint import open_checkpoint
from flux2_core.weights.keymaps import plan as keymap_plan
from flux2_core.weights.loading import load_checkpoint

WORLD = 2
# 4 heads x 16 (RoPE axes 4 x 4), 2 + 2 blocks, text 3 x 16 wide; dev adds the guidance embedder.
KLEIN = Flux2Config(
    hidden_size=64, num_heads=4, depth=2, depth_single_blocks=2, context_in_dim=48, axes_dim=(4,) * 4
)
DEV = Flux2Config(**{**KLEIN.__dict__, "guidance_embed": True})
THREE_HEADS = Flux2Config(**{**KLEIN.__dict__, "hidden_size": 48, "num_heads": 3})

# case -> (file, variant, mode, text tokens, (width, height), reference grids, guidance)
# klein: 7 text and 20 + 9 image tokens, which 2 does not divide (sequence mode pads); dev: 8 and 16 + 16,
# a batch of 2.
RUNS = {
    f"{name}-{mode}": (file, variant, mode, *shape)
    for name, file, variant, shape in (
        ("klein", "flux-2-klein-4b.safetensors", "distilled", (7, (80, 64), [(3, 3)], 1.0)),
        ("dev", "dev-diffusers.safetensors", "dev", (8, (64, 64), [(4, 4)], 4.0)),
        ("devlora", "dev-diffusers.safetensors", "dev", (8, (64, 64), [(4, 4)], 4.0)),
        ("kv", "flux-2-klein-4b.safetensors", "kv", (7, (80, 64), [(3, 3)], 1.0)),
        ("fp8", "klein-fp8.safetensors", "distilled", (8, (64, 64), [(2, 4)], 1.0)),
        ("strength", "flux-2-klein-4b.safetensors", "distilled", (7, (80, 64), [(3, 3), (2, 4)], 1.0)),
        ("kvstrength", "flux-2-klein-4b.safetensors", "kv", (7, (80, 64), [(3, 3), (2, 4)], 1.0)),
    )
    for mode in ("tensor", "sequence")
}
DEV_LORA = "dev-lora.safetensors"  # applied in the devlora cases (see write_dev_lora)
# per-reference strengths of the cases named after them (the bias travels with the keys in sequence mode)
STRENGTHS = {
    "strength": (ReferenceStrength(0.5), ReferenceStrength(2.0, 0.0, 0.5)),
    "kvstrength": (ReferenceStrength(3.0), ReferenceStrength(0.0)),
}
# the step cache's run: file, the case whose inputs it takes, threshold (random weights change by about 1 per
# step: see test_step_cache.py), steps
CACHED = ("flux-2-klein-4b.safetensors", "klein-tensor", 1.0, 8)
REFUSED = {  # file, mode -> what the error names
    "three-heads-tensor": ("three-heads.safetensors", "tensor", "divides the model's 3 heads"),
    "three-heads-sequence": ("three-heads.safetensors", "sequence", "divides the model's 3 heads"),
    "nvfp4-tensor": ("klein-nvfp4.safetensors", "tensor", "nvfp4, which tensor parallelism cannot slice"),
    "convrot64-tensor": ("klein-int8-convrot64.safetensors", "tensor", "groups of 64 columns (ConvRot)"),
}
# W4A8 (written by comfy-kitchen's quantiser, where it is installed): whole in sequence mode, refused by name
# in tensor mode; activations quantised per token, so the ranks' rows equal one process's
W4A8 = importlib.util.find_spec("comfy_kitchen") is not None
if W4A8:
    RUNS["w4a8-sequence"] = ("klein-w4a8.safetensors", "distilled", "sequence", 8, (64, 64), [(2, 4)], 1.0)
    REFUSED["w4a8-tensor"] = ("klein-w4a8.safetensors", "tensor", "(W4A8), which tensor parallelism cannot")


def random_state_dict(config: Flux2Config, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    sd = Flux2Transformer(config).state_dict()
    return {
        k: (1.0 + 0.3 * torch.randn(v.shape)) if v.ndim == 1 else torch.randn(v.shape) / v.shape[1] ** 0.5
        for k, v in sd.items()
    }


# Our names -> diffusers' (the inverse of the product's key map; q, k, v split, norm_out's halves swapped).
_GLOBAL = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
}
_DOUBLE = {
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight",
    "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
    "img_attn.proj.weight": "attn.to_out.0.weight",
    "txt_attn.proj.weight": "attn.to_add_out.weight",
    "img_mlp.0.weight": "ff.linear_in.weight",
    "img_mlp.2.weight": "ff.linear_out.weight",
    "txt_mlp.0.weight": "ff_context.linear_in.weight",
    "txt_mlp.2.weight": "ff_context.linear_out.weight",
}
_SINGLE = {
    "linear1.weight": "attn.to_qkv_mlp_proj.weight",
    "linear2.weight": "attn.to_out.weight",
    "norm.query_norm.scale": "attn.norm_q.weight",
    "norm.key_norm.scale": "attn.norm_k.weight",
}
_QKV = {"img": ("to_q", "to_k", "to_v"), "txt": ("add_q_proj", "add_k_proj", "add_v_proj")}


def diffusers_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        block = re.fullmatch(r"(double|single)_blocks\.(\d+)\.(.+)", key)
        if block is None and key == "final_layer.adaLN_modulation.1.weight":
            shift, scale = value.chunk(2)
            out["norm_out.linear.weight"] = torch.cat([scale, shift])
        elif block is None:
            out[_GLOBAL[key.removesuffix(".weight")] + ".weight"] = value
        elif block[1] == "single":
            out[f"single_transformer_blocks.{block[2]}.{_SINGLE[block[3]]}"] = value
        elif stream := re.fullmatch(r"(img|txt)_attn\.qkv\.weight", block[3]):
            for name, part in zip(_QKV[stream[1]], value.chunk(3), strict=True):
                out[f"transformer_blocks.{block[2]}.attn.{name}.weight"] = part
        else:
            out[f"transformer_blocks.{block[2]}.{_DOUBLE[block[3]]}"] = value
    return {k: v.contiguous() for k, v in out.items()}


def write_dev_lora(path: Path) -> None:
    """A LoRA on every linear of the tiny dev DiT, in the layouts whose patches tensor parallelism cuts
    differently: BFL low-rank pairs (with alpha on some), diffusers' q / k / v of a fused qkv (row slices),
    and LoKr on a column-parallel and a row-parallel layer (cut in their delta)."""
    g = torch.Generator().manual_seed(17)
    tensors = {}
    lokr = {"double_blocks.1.txt_mlp.0": ((4, 4), (96, 16)), "single_blocks.0.linear2": ((4, 4), (16, 64))}
    split = ("double_blocks.0.img_attn.qkv", ("to_q", "to_k", "to_v"))
    for key, value in sorted(random_state_dict(DEV, seed=0).items()):
        layer = key.removesuffix(".weight")
        if value.ndim != 2:
            continue
        rows, cols = value.shape
        if layer in lokr:
            (a, b), (c, d) = lokr[layer]
            tensors[f"diffusion_model.{layer}.lokr_w1"] = torch.randn(a, b, generator=g) * 0.3
            tensors[f"diffusion_model.{layer}.lokr_w2"] = torch.randn(c, d, generator=g) * 0.1
        elif layer == split[0]:
            for name in split[1]:
                prefix = f"transformer.transformer_blocks.0.attn.{name}"
                tensors[prefix + ".lora_A.weight"] = torch.randn(4, cols, generator=g) * 0.2
                tensors[prefix + ".lora_B.weight"] = torch.randn(rows // 3, 4, generator=g) * 0.2
        else:
            tensors[f"diffusion_model.{layer}.lora_A.weight"] = torch.randn(4, cols, generator=g) * 0.2
            tensors[f"diffusion_model.{layer}.lora_B.weight"] = torch.randn(rows, 4, generator=g) * 0.2
            if len(tensors) % 3 == 0:
                tensors[f"diffusion_model.{layer}.alpha"] = torch.tensor(2.0)
    save_file(tensors, str(path))


def _with_lora(model, root: Path, case: str):
    if not case.startswith("devlora"):
        return model
    return model.with_lora(prepare_lora(read_lora(root / DEV_LORA), model.transformer, strength=0.8))


def write_files(root: Path) -> None:
    klein = random_state_dict(KLEIN, seed=1)
    write_dev_lora(root / DEV_LORA)
    save_file(klein, str(root / "flux-2-klein-4b.safetensors"))
    save_file(diffusers_state_dict(random_state_dict(DEV, seed=2)), str(root / "dev-diffusers.safetensors"))
    save_file(random_state_dict(THREE_HEADS, seed=3), str(root / "three-heads.safetensors"))
    write_quantised(klein, root / "klein-fp8.safetensors", "float8_e4m3fn", high=torch.float32)
    write_quantised(klein, root / "klein-nvfp4.safetensors", "nvfp4", high=torch.float32)
    for g in (16, 64):
        write_quantised(klein, root / f"klein-int8-convrot{g}.safetensors", "int8_tensorwise", convrot=g)
    if W4A8:
        from comfy_kitchen.tensor import AsymW4A8Int8Layout

        entry = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 16}
        path = root / "klein-w4a8.safetensors"
        write_with_kitchen(klein, path, AsymW4A8Int8Layout, entry, high=torch.float32, convrot_groupsize=16)
    for case, (_, _, _, text, (width, _), grids, _) in RUNS.items():
        g = torch.Generator().manual_seed(len(case) * 7 + width)
        torch.save(
            {
                "ctx": torch.randn(1, text, KLEIN.context_in_dim, generator=g),
                "refs": [torch.randn(1, 128, h, w, generator=g) for h, w in grids],
            },
            root / f"{case}.inputs.pt",
        )


def _settings(case: str) -> SampleSettings:
    _, _, _, _, (width, height), _, guidance = RUNS[case]
    batch = 2 if case.startswith("dev") else 1
    return SampleSettings(width, height, steps=2, guidance=guidance, seed=3, batch_size=batch)


def _record_sums(comm) -> list:
    """The statistics ``comm.sum_image_tokens`` returns, from now on, in a list."""
    sums, summed = [], comm.sum_image_tokens

    def recording(stats):
        out = summed(stats)
        sums.append(out.tolist())
        return out

    comm.sum_image_tokens = recording
    return sums


def _cached_settings() -> SampleSettings:
    return SampleSettings(80, 64, steps=CACHED[3], guidance=1.0, seed=3)


def _inputs(root: Path, case: str):
    data = torch.load(root / f"{case}.inputs.pt")
    refs = ReferenceLatents.from_latents(data["refs"])
    strengths = STRENGTHS.get(case.split("-")[0])
    return data["ctx"], refs if strengths is None else replace(refs, strengths=strengths)


def _regional_inputs():
    """A global prompt of 7 tokens and two regions (4 and 6 tokens) over the left and right of 80 x 64."""
    g = torch.Generator().manual_seed(9)
    ctx = torch.randn(1, 7, KLEIN.context_in_dim, generator=g)
    left = torch.zeros(64, 80)
    left[:, :32] = 1
    regions = tuple(
        Region(torch.randn(1, n, KLEIN.context_in_dim, generator=g), m, s)
        for n, m, s in ((4, left, 1.0), (6, 1 - left, 2.0))  # 17 text tokens: the shares are padded
    )
    return ctx, RegionalPrompt(ctx, regions)


REGIONAL_EDITS = ("distilled", "kv")  # regions with references, the plain klein model and the 9B-KV one


def _regional_edit_inputs(root: Path):
    """The regional prompt of ``_regional_inputs`` with the two references of the "strength" cases (at 0.5,
    and at 2 for the first half of the steps): 17 text, 20 image and 17 reference tokens."""
    ctx, regions = _regional_inputs()
    return ctx, regions, _inputs(root, "strength-tensor")[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_as(rank: int, port: int) -> None:
    """The environment torchrun gives rank ``rank`` of ``WORLD`` processes on this host."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip


def run_workers(target, *args, timeout: float = 240) -> list[int | None]:
    """``target(rank, *args)`` in ``WORLD`` spawned processes; their exit codes (None: still running at
    ``timeout`` seconds, then killed)."""
    context = mp.get_context("spawn")
    workers = [context.Process(target=target, args=(rank, *args)) for rank in range(WORLD)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(timeout=max(0.0, deadline - time.monotonic()))
    codes = [w.exitcode for w in workers]
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join()
    return codes


def _worker(rank: int, root: str, port: int) -> None:
    root = Path(root)
    join_as(rank, port)
    torch.set_num_threads(1)
    try:
        dist = init_distributed("cpu")
        report = {}
        for case, (file, variant, mode, *_) in RUNS.items():
            model = load_transformer_parallel(root / file, mode, variant, torch.float32, "cpu")
            model = _with_lora(model, root, case)
            ctx, refs = _inputs(root, case) if dist.is_main else (None, None)
            ctx, refs = broadcast_conditioning(ctx), broadcast_references(refs)
            latents = sample(SampleRequest(model, ctx, _settings(case), references=refs))
            np.save(root / f"{case}.rank{rank}.npy", latents.numpy())
            info = parallel_info(model)
            report[case] = {"weight_bytes": info.weight_bytes, "bytes_read": info.bytes_read}
        for mode in ("tensor", "sequence"):  # the step cache: every rank takes the same decisions
            model = load_transformer_parallel(root / CACHED[0], mode, "distilled", torch.float32, "cpu")
            ctx, refs = _inputs(root, CACHED[1]) if dist.is_main else (None, None)
            ctx, refs = broadcast_conditioning(ctx), broadcast_references(refs)
            cache, sums = StepCache(CACHED[2]), _record_sums(model.transformer.comm)
            latents = sample(SampleRequest(model, ctx, _cached_settings(), references=refs, step_cache=cache))
            np.save(root / f"cached-{mode}.rank{rank}.npy", latents.numpy())
            report[f"cached-{mode}"] = {"full": cache.passes[0].full_steps, "sums": sums}
        for mode in ("tensor", "sequence"):  # regional prompts: the mask travels with the tokens
            model = load_transformer_parallel(root / "flux-2-klein-4b.safetensors", mode, "distilled")
            ctx, regions = _regional_inputs()
            latents = sample(SampleRequest(model, ctx, _settings("klein-tensor"), regions=regions))
            np.save(root / f"regional-{mode}.rank{rank}.npy", latents.numpy())
            for variant in REGIONAL_EDITS:  # with references: the mask's reference keys travel too
                model = load_transformer_parallel(root / "flux-2-klein-4b.safetensors", mode, variant)
                ctx, regions, refs = _regional_edit_inputs(root)
                latents = sample(
                    SampleRequest(model, ctx, _settings("klein-tensor"), references=refs, regions=regions)
                )
                np.save(root / f"regional-edit-{variant}-{mode}.rank{rank}.npy", latents.numpy())
        report["int8-convrot16"] = _int8_slices(root / "klein-int8-convrot16.safetensors", dist)
        for case, (file, mode, _) in REFUSED.items():
            try:
                load_transformer_parallel(root / file, mode, "distilled")
                report[case] = "loaded"
            except Flux2Error as e:
                report[case] = str(e)
        (root / f"report.rank{rank}.json").write_text(json.dumps(report))
        close_distributed()
    except BaseException:
        (root / f"error.rank{rank}.txt").write_text(traceback.format_exc())
        raise


def _int8_slices(path: Path, dist) -> float:
    """Largest difference between this rank's dequantised int8 (per-row, ConvRot) weights, kept quantised
    or dequantised at load, and its slices of the whole model's."""
    whole = dict(linears(load_transformer(path, "distilled").transformer))
    kept = load_transformer_parallel(path, "tensor", "distilled").transformer
    eager = load_transformer_parallel(path, "tensor", "distilled", keep_quantized=False).transformer
    assert kept.double_blocks[0].img_attn.qkv.weight.dtype == torch.int8
    assert eager.double_blocks[0].img_attn.qkv.weight.dtype == torch.float32
    plan, worst = tensor_plan(KLEIN), 0.0
    for name, layer in [*linears(kept), *linears(eager)]:
        w = layer.compute_weight(torch.float32, torch.device("cpu"))
        full = whole[name].compute_weight(torch.float32, torch.device("cpu"))
        if name in plan:
            split = plan[name]
            full = torch.cat(
                [full.narrow(split.dim, a, b - a) for a, b in split.ranges(dist.rank, dist.world)], split.dim
            )
        worst = max(worst, (w - full).abs().max().item())
    return worst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    write_files(root)
    codes = run_workers(_worker, str(root), free_port())
    errors = [p.read_text() for p in sorted(root.glob("error.rank*.txt"))]
    assert not errors and codes == [0] * WORLD, "\n".join(errors) or f"a worker failed: {codes}"
    reports = [json.loads((root / f"report.rank{r}.json").read_text()) for r in range(WORLD)]
    return root, reports


def _single(root: Path, case: str):
    file, variant, *_ = RUNS[case]
    model = _with_lora(load_transformer(root / file, variant), root, case)
    ctx, refs = _inputs(root, case)
    return model, sample(SampleRequest(model, ctx, _settings(case), references=refs)).numpy()


def test_a_dev_lora_in_parallel_changes_the_result(runs):
    """The devlora cases equal one process with the LoRA (above, in both modes: under tensor parallelism
    each rank adds its share of every change); the control: the LoRA changes that result."""
    root, _ = runs
    _, with_lora = _single(root, "devlora-tensor")
    ctx, refs = _inputs(root, "devlora-tensor")
    plain = load_transformer(root / RUNS["devlora-tensor"][0], "dev")
    without = sample(SampleRequest(plain, ctx, _settings("devlora-tensor"), references=refs)).numpy()
    assert np.abs(with_lora - without).max() > 1e-2, "the LoRA barely changes the result"


@pytest.mark.parametrize("case", list(RUNS))
def test_parallel_result_equals_one_process(runs, case):
    root, _ = runs
    _, expected = _single(root, case)
    got = [np.load(root / f"{case}.rank{r}.npy") for r in range(WORLD)]
    assert np.array_equal(got[0], got[1]), "the ranks disagree"
    np.testing.assert_allclose(got[0], expected, atol=1e-5, rtol=0)
    assert np.abs(got[0] - expected).max() < 1e-5


@pytest.mark.parametrize("mode", ["tensor", "sequence"])
def test_the_step_cache_takes_one_decision_on_every_rank(runs, mode):
    root, reports = runs
    model = load_transformer(root / CACHED[0], "distilled")
    ctx, refs = _inputs(root, CACHED[1])
    cache = StepCache(CACHED[2])
    expected = sample(
        SampleRequest(model, ctx, _cached_settings(), references=refs, step_cache=cache)
    ).numpy()
    assert 1 < cache.passes[0].full_steps < CACHED[3]  # some steps skipped, not all
    seen = [r[f"cached-{mode}"] for r in reports]
    assert [s["full"] for s in seen] == [cache.passes[0].full_steps] * WORLD
    # the statistics the decisions rest on are the same numbers on every rank, and (up to the order of the
    # sums, and the world-fold count of tensor mode's replicated tokens) the one process's
    assert seen[0]["sums"] == seen[1]["sums"] and len(seen[0]["sums"]) == CACHED[3] - 1
    ratios = [change / scale for change, scale in seen[0]["sums"]]
    assert 0.3 < min(ratios) and max(ratios) < 5.0, ratios
    got = [np.load(root / f"cached-{mode}.rank{r}.npy") for r in range(WORLD)]
    assert np.array_equal(got[0], got[1]), "the ranks disagree"
    np.testing.assert_allclose(got[0], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["klein", "dev", "fp8"])
def test_tensor_ranks_hold_and_read_their_share(runs, name):
    root, reports = runs
    path = root / RUNS[f"{name}-tensor"][0]
    whole = load_checkpoint(DIT_SPEC, open_checkpoint(path, "transformer"), torch.float32)
    raw = load_file(str(path))
    # one process reads every tensor (norm_out twice in diffusers' layout: one read per half it fills)
    read_whole = whole.checkpoint.tensors.bytes_read
    assert read_whole == sum(t.nbytes for t in raw.values()) + (
        raw["norm_out.linear.weight"].nbytes if name == "dev" else 0
    )
    plan = tensor_plan(whole.config)
    for rank, report in enumerate(reports):
        held = report[f"{name}-tensor"]
        # replicated layers whole, sliced ones 1/p (a per-tensor scale whole)
        expected = sum(_share(key, t, plan) for key, t in whole.module.state_dict().items())
        assert (
            held["weight_bytes"]
            == expected
            == planned_weight_bytes(path, "tensor", WORLD, torch.float32, rank)
        )
        # each rank reads only its share of each tensor of the file (the quantisation markers whole)
        assert report[f"{name}-sequence"]["bytes_read"] == read_whole
        saved = sum(t.nbytes - _share(_our_key(key), t, plan) for key, t in raw.items())
        assert held["bytes_read"] == read_whole - saved
        if name != "fp8":  # about half (the fp8 blocks are small next to the float32 rest)
            assert held["weight_bytes"] < 0.7 * held_bytes(whole.module)
            assert held["bytes_read"] < 0.7 * read_whole


def _share(key: str, tensor: torch.Tensor, plan) -> int:
    """Bytes of ``key`` one rank holds: 1/p of a sliced weight or of a per-row scale of sliced rows."""
    layer, role = key.rsplit(".", 1)
    split = plan.get(layer)
    sliced = split is not None and (
        role == "weight" or (role == "weight_scale" and split.dim == 0 and tensor.numel() > 1)
    )
    return tensor.nbytes // WORLD if sliced else tensor.nbytes


def _our_key(file_key: str) -> str:
    return next(iter(keymap_plan([file_key], DIT_SPEC.keymap)))


def test_quantised_slices_and_refusals(runs):
    _, reports = runs
    for report in reports:
        assert report["int8-convrot16"] < 1e-6  # per-row scales sliced with the rows, ConvRot groups kept
        for case, (_, _, words) in REFUSED.items():
            assert words in report[case], report[case]
    assert "use one of 1, 3 processes" in reports[0]["three-heads-tensor"]


def test_process_count_must_divide_heads_and_mlp():
    check_world(KLEIN, 4, "tensor")
    with pytest.raises(
        Flux2Error, match="divides the model's 4 heads and its MLP width 192: use one of 1, 2, 4"
    ):
        check_world(KLEIN, 3, "tensor")
    with pytest.raises(Flux2Error, match="unknown parallel mode"):
        check_world(KLEIN, 2, "pipeline")


def test_the_collective_timeout_covers_rank_0s_encoding_and_is_settable(monkeypatch):
    """While rank 0 alone loads and runs the text encoder (a 24B Mistral for dev) the others wait in their
    first broadcast: PyTorch's default timeout (10 minutes for NCCL) must not end them first."""
    from datetime import timedelta

    from flux2_core.devices import parallel

    monkeypatch.delenv(parallel.TIMEOUT_ENV, raising=False)
    assert parallel.collective_timeout() == timedelta(hours=1)
    monkeypatch.setenv(parallel.TIMEOUT_ENV, "2.5")
    assert parallel.collective_timeout() == timedelta(minutes=2.5)
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(parallel.TIMEOUT_ENV, bad)
        with pytest.raises(Flux2Error, match="FLUX2_PARALLEL_TIMEOUT_MIN"):
            parallel.collective_timeout()
    seen = {}
    monkeypatch.setenv(parallel.TIMEOUT_ENV, "7")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: False)
    join = lambda backend, **kw: seen.update(kw, backend=backend)  # noqa: E731
    monkeypatch.setattr(parallel.dist, "init_process_group", join)
    monkeypatch.setattr(parallel.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(parallel.dist, "get_world_size", lambda: 1)
    parallel.init_distributed("cpu")
    assert seen == {"backend": "gloo", "timeout": timedelta(minutes=7)}


@pytest.mark.parametrize("mode", ["tensor", "sequence"])
def test_regional_prompts_in_parallel_equal_one_process(runs, mode):
    root, _ = runs
    model = load_transformer(root / "flux-2-klein-4b.safetensors", "distilled")
    ctx, regions = _regional_inputs()
    expected = sample(SampleRequest(model, ctx, _settings("klein-tensor"), regions=regions)).numpy()
    got = [np.load(root / f"regional-{mode}.rank{r}.npy") for r in range(WORLD)]
    assert np.array_equal(got[0], got[1]), "the ranks disagree"
    np.testing.assert_allclose(got[0], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", REGIONAL_EDITS)
@pytest.mark.parametrize("mode", ["tensor", "sequence"])
def test_regional_prompts_with_references_in_parallel_equal_one_process(runs, mode, variant):
    root, _ = runs
    model = load_transformer(root / "flux-2-klein-4b.safetensors", variant)
    ctx, regions, refs = _regional_edit_inputs(root)
    settings = _settings("klein-tensor")
    expected = sample(SampleRequest(model, ctx, settings, references=refs, regions=regions)).numpy()
    got = [np.load(root / f"regional-edit-{variant}-{mode}.rank{r}.npy") for r in range(WORLD)]
    assert np.array_equal(got[0], got[1]), "the ranks disagree"
    np.testing.assert_allclose(got[0], expected, atol=1e-5, rtol=0)
    without = sample(SampleRequest(model, ctx, settings, regions=regions)).numpy()
    assert np.abs(expected - without).mean() > 1e-3, "the references barely change the regional run"
