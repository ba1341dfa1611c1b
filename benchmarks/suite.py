"""Our FLUX.2 [klein] code against diffusers and native ComfyUI on the same random weights, in one process.

    python benchmarks/suite.py --json results/cpu_medium.json --svg results/cpu_medium.svg
    COMFYUI_PATH=/opt/comfyui/ComfyUI /opt/comfyui/venv/bin/python benchmarks/suite.py ...   # adds native
    python benchmarks/suite.py --gpu-real        # klein 4B and 9B shapes, bf16, 1024², on a CUDA device
    python benchmarks/suite.py --gpu-real --shapes klein-4b klein-9b dev fill
        # also FLUX.2 [dev] (real widths, a quarter of its blocks) and FLUX.1 Fill [dev] (its real shape)
    python benchmarks/suite.py --gpu-real --dry-run [--card-gb 80]   # no GPU needed: the device memory
        # each stage would hold, added up on the meta device (exits 1 when a shape does not fit the card)
    python benchmarks/suite.py --shapes klein-4b dev fill   # each family at the medium shape (a CPU)
    python benchmarks/suite.py --real-width --dtype bfloat16 --sizes 512 1024 --skip text vae e2e load
        # klein 4B's real widths (hidden 3072 = 24 heads x 128, text 7680) with 1 + 4 blocks, so that the
        # three implementations' copies fit on a 24 GB machine: the DiT cases at the shapes that matter

What it measures, each implementation called in turn round by round (ours, diffusers, native, ours, ...)
after one warm-up call each, reporting median and minimum per case and the ratio other / ours (> 1: ours
faster):
- DiT time per step: text-to-image at each ``--sizes`` (tokens = (size/16)² + 512 text), with ours also
  timed when the First-Block Cache skips that step (first block, stored residual, final layer), edit with 1, 2
  and 4 references of ``--ref-size``², and the KV model's cached step (references' K/V computed once; ours
  and diffusers' KV transformer path; native ComfyUI has no K/V cache) next to its first (extract) step;
  the peak RSS above the process's RSS before the call (CPU) or the peak VRAM above the allocated memory
  before it (GPU), the achieved GFLOP/s (linear and attention FLOPs counted from the shape) and its share of
  the machine's matmul peak (a large ``torch.matmul`` timed per dtype);
- text encoding of a 512-token prompt: our ``TextEncoder`` (27 layers) against transformers' Qwen3 called
  the way diffusers' klein pipeline calls it (all 28 layers), on one random Qwen3;
- VAE encode and decode at ``--vae-size``²: ours, diffusers' ``AutoencoderKLFlux2`` and native's ``VAE``;
- end to end, a 4-step text-to-image run (prompt -> pixels): ours against diffusers' ``Flux2KleinPipeline``;
- load time and load peak RSS (VmHWM) of each DiT from a file, each in a fresh subprocess.
The dev shape runs the text-to-image and edit cases with its embedded guidance (no KV model exists for it);
the Fill shape runs one Fill step at each ``--sizes`` (384 channels a token, T5 text, CLIP's pooled vector,
guidance 30), with ours also timed when the step cache skips it. Both time the DiT only.
Every output is compared with ours (max abs difference) so a mismatched call would show. Without
``COMFYUI_PATH`` native ComfyUI is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import suite_fill as sf
import suite_models as sm
import torch
from klein_shapes import ROOT
from live_tensors import peak_tensor_bytes
from suite_memory import GIB, HEADROOM, Ledger, card_bytes, held_bytes, step_allowance, vae_allowance
from suite_plot import line_plot

from flux2_core.configs import Flux2Config
from flux2_core.dit import block_ops
from flux2_core.dit.call import call_extras
from flux2_core.dit.step_cache import MAX_STEP_CACHE, FirstBlockCache
from flux2_core.flux1.config import Flux1Config

IMPLS = ("ours", "diffusers", "native")
PROMPT = "a red fox in the snow, watercolour, soft morning light, wide shot"


# ---------------------------------------------------------------------------------------------- measuring


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # this device's work, whichever device is current


def proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs), so each call's peak is its own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class Timer:
    """One call of ``fn``: seconds, and the peak memory above what was in use before it."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn):
        sync(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        reset_peak_rss()
        rss = proc_status("VmRSS")
        start = time.perf_counter()
        out = fn()
        sync(self.device)
        seconds = time.perf_counter() - start
        mem = {"peak_rss_above": proc_status("VmHWM") - rss}
        if self.device.type == "cuda":
            mem["peak_vram_above"] = torch.cuda.max_memory_allocated(self.device) - base
        return seconds, mem, out


def alternate(calls: dict, rounds: int, timer: Timer, reference: str = "ours") -> dict:
    """``calls``: impl -> zero-arg callable. One warm-up each, then ``rounds`` rounds in turn."""
    result = {name: {"times_s": [], "peak_rss_above": 0, "peak_vram_above": 0} for name in calls}
    outputs = {}
    with torch.inference_mode():
        for name, fn in calls.items():
            _, _, out = timer(fn)
            outputs[name] = out
        for _ in range(rounds):
            for name, fn in calls.items():
                seconds, mem, _ = timer(fn)
                r = result[name]
                r["times_s"].append(seconds)
                for key, value in mem.items():
                    r[key] = max(r[key], value)
        if timer.device.type == "cpu":  # untimed: the tensors' own peak, apart from the allocator's
            for name, fn in calls.items():
                result[name]["peak_tensors_above"] = peak_tensor_bytes(fn)
    for name, r in result.items():
        r["median_s"], r["min_s"] = statistics.median(r["times_s"]), min(r["times_s"])
        if reference in outputs and name != reference and torch.is_tensor(outputs[name]):
            a, b = outputs[name].float(), outputs[reference].float()
            r["max_abs_diff_vs_ours"] = (a - b).abs().max().item() if a.shape == b.shape else f"{a.shape}"
    if reference in result:
        for name, r in result.items():
            if name != reference:
                r["ratio_median"] = r["median_s"] / result[reference]["median_s"]
                r["ratio_min"] = r["min_s"] / result[reference]["min_s"]
    return result


def matmul_peak(device: torch.device, dtypes: list[str], quick: bool) -> dict:
    """GFLOP/s of the best of several large square ``torch.matmul`` calls, per dtype: on a CPU at two sizes
    (the best of both: one size's blocking can miss the peak), repeated until a second has been spent on
    each, so that a passing stall does not lower the figure every percentage is taken of."""
    out = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        if device.type == "cuda":
            sizes = [8192]
        else:
            sizes = [1024, 2048]
        sizes = [n // 2 for n in sizes] if quick else sizes
        best_rate, best_n = 0.0, sizes[0]
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            torch.matmul(a, b)
            best, spent, calls = float("inf"), 0.0, 0
            budget = 0.1 if quick else 1.0  # seconds of calls at least, on a CPU
            while calls < (5 if device.type == "cuda" else 3) or (device.type == "cpu" and spent < budget):
                sync(device)
                start = time.perf_counter()
                torch.matmul(a, b)
                sync(device)
                took = time.perf_counter() - start
                best, spent, calls = min(best, took), spent + took, calls + 1
                if device.type == "cpu" and best > 5:
                    break
            if 2 * n**3 / best / 1e9 > best_rate:
                best_rate, best_n = 2 * n**3 / best / 1e9, n
        out[name] = {"n": best_n, "gflops": best_rate}
    return out


# ---------------------------------------------------------------------------------------------- the shapes


def medium_config(args, family: str = "klein") -> Flux2Config | Flux1Config:
    """The medium shape of a family: hidden = heads x 128, the blocks and text width of the arguments."""
    if family == "fill":
        return Flux1Config(
            hidden_size=args.heads * 128,
            num_heads=args.heads,
            depth=args.depth,
            depth_single_blocks=args.single,
            context_in_dim=args.text_width,
            vec_in_dim=args.text_width,
        )
    return Flux2Config(
        hidden_size=args.heads * 128,
        num_heads=args.heads,
        depth=args.depth,
        depth_single_blocks=args.single,
        context_in_dim=3 * args.text_width,
        guidance_embed=family == "dev",
    )


def family(shape: str) -> str:
    return shape if shape in ("dev", "fill") else "klein"


def shape_configs(args) -> dict:
    """label -> config of every shape to run: the real ones on a GPU, else each family's medium one."""
    if args.gpu_real:
        return {s: sm.REAL_SHAPES[s] for s in args.shapes}
    out = {}
    for name in dict.fromkeys(family(s) for s in args.shapes):
        base = "real-width" if args.real_width else "medium"
        out[base if name == "klein" else f"{name} {base}"] = medium_config(args, name)
    return out


def cases(args, kv: bool = True) -> list[sm.Case]:
    out = [sm.Case(f"t2i {s}²", s, ref_size=args.ref_size) for s in args.sizes]
    edit = args.edit_size
    out += [sm.Case(f"edit {edit}² + {n} ref", edit, n, args.ref_size) for n in args.refs]
    if kv:
        out += [sm.Case(f"KV cached {edit}² + {n} ref", edit, n, args.ref_size, kv=True) for n in args.refs]
    return out


# ---------------------------------------------------------------------------------------------- sections


def skipped_step(ours, case, inp, rounds: int, timer) -> dict:
    """Our step when the First-Block Cache skips it: the first block, the comparison, the stored residual
    and the final layer (a cache that skips every step after the full one it keeps)."""
    call = ours.step(case, inp, FirstBlockCache(MAX_STEP_CACHE))
    with torch.inference_mode():
        call()  # the full step it keeps
    return alternate({"ours": call}, rounds, timer)


def with_flops(case, flops: float, impls: dict, peak: float) -> dict:
    """A case's results, each implementation's achieved GFLOP/s and share of the matmul peak added."""
    for res in impls.values():
        res["gflops"] = flops / res["median_s"] / 1e9
        res["pct_of_matmul_peak"] = 100 * res["gflops"] / peak if peak else None
    return {"case": vars(case), "flops": flops, "impls": impls}


def bench_dit(args, config, impls: dict, device, dtype, timer, peak: float) -> dict:
    results = {}
    dev = config.guidance_embed  # FLUX.2 [dev]: embedded guidance, no KV model
    for case in cases(args, kv=not dev):
        inp = sm.make_inputs(case, config.context_in_dim, device, dtype, guidance=4.0 if dev else None)
        with torch.inference_mode():
            calls = {n: i.step(case, inp) for n, i in impls.items() if i.has_kv or not case.kv}
        print(f"  {case.name}: {case.query_tokens} query tokens, {case.attended_tokens} attended", flush=True)
        r = alternate(calls, args.rounds, timer)
        results[case.name] = with_flops(case, sm.dit_flops(config, case), r, peak)
        if case.kv:  # the first step of the KV model: references' K/V computed, then the step
            with torch.inference_mode():
                calls = {n: i.extract(case, inp) for n, i in impls.items() if i.has_kv}
            r = alternate(calls, max(1, args.rounds // 2), timer)
            results[case.name.replace("cached", "extract")] = {"case": vars(case), "impls": r}
        if not case.refs and "ours" in impls:  # the same step when the First-Block Cache skips it
            results[f"{case.name} skipped by the step cache"] = {
                "case": vars(case),
                "impls": skipped_step(impls["ours"], case, inp, args.rounds, timer),
            }
        if hasattr(impls.get("diffusers"), "kv_mode"):
            impls["diffusers"].kv_mode(False)
        summary = "  ".join(
            f"{n} {v['median_s'] * 1000:.0f} ms" for n, v in results[case.name]["impls"].items()
        )
        print(f"    {summary}", flush=True)
    return results


def bench_fill(args, config: Flux1Config, impls: dict, device, dtype, timer, peak: float) -> dict:
    """One FLUX.1 Fill step at each ``--sizes``, and ours when the First-Block Cache skips it."""
    results = {}
    for case in sf.fill_cases(args.sizes):
        inp = sf.make_fill_inputs(case, config, device, dtype)
        with torch.inference_mode():
            calls = {n: i.step(case, inp) for n, i in impls.items()}
        print(f"  {case.name}: {case.query_tokens} tokens", flush=True)
        r = alternate(calls, args.rounds, timer)
        results[case.name] = with_flops(case, sf.fill_flops(config, case), r, peak)
        results[f"{case.name} skipped by the step cache"] = {
            "case": vars(case),
            "impls": skipped_step(impls["ours"], case, inp, args.rounds, timer),
        }
        print("    " + "  ".join(f"{n} {v['median_s'] * 1000:.0f} ms" for n, v in r.items()), flush=True)
    return results


def run_fill_shape(args, label: str, config: Flux1Config, device, dtype, peak: float, with_native) -> dict:
    from tiny_flux1 import bfl_fill_state_dict

    print(f"{label}: FLUX.1 Fill, {config.hidden_size} wide, {config.depth}+{config.depth_single_blocks} "
          f"blocks, {args.dtype} on {device}", flush=True)  # fmt: skip
    ledger = Ledger(device)
    theirs = sf.build_diffusers_fill(config, device, dtype)
    ledger.stage("diffusers' DiT", theirs)
    bfl = bfl_fill_state_dict(theirs)
    ledger.stage("+ its BFL state dict", theirs, bfl)
    impls = {"ours": sf.FillOurs(bfl, device, dtype), "diffusers": sf.FillDiffusers(theirs)}
    if with_native and not args.dry_run:
        impls["native"] = sf.FillNative(bfl, device, dtype)
    native = held_bytes(bfl) if args.dry_run else 0  # native's copy, counted in full when not built
    del bfl
    tokens = max(c.query_tokens for c in sf.fill_cases(args.sizes))
    ledger.stage("DiT cases", *impls.values(), extra=native + step_allowance(config, dtype, tokens))
    out = {"config": vars(config) | {"axes_dim": list(config.axes_dim)}}
    out["parameters"] = sum(p.numel() for p in theirs.parameters())
    if "dit" not in args.skip and not args.dry_run:
        out["dit"] = bench_fill(args, config, impls, device, dtype, Timer(device), peak)
    out["memory"] = ledger
    return out


def bench_text(args, width, device, dtype, timer) -> tuple[dict, object, object]:
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
    from tiny_text import model_tensors, reference_hf_tokenizer

    from flux2_core.text.encoder import text_encoder_from_state_dict

    hf = sm.build_text_model(width, device, dtype)
    tokenizer = reference_hf_tokenizer()
    if args.dry_run:  # ours loads through the CPU, which meta tensors cannot: counted as hf's size instead
        return {}, None, (hf, tokenizer)
    ours = text_encoder_from_state_dict(model_tensors(hf), dtype=dtype, device=device)

    def theirs():
        return Flux2KleinPipeline._get_qwen3_prompt_embeds(
            text_encoder=hf,
            tokenizer=tokenizer,
            prompt=[PROMPT],
            dtype=dtype,
            device=device,
            max_sequence_length=512,
            hidden_states_layers=(9, 18, 27),
        )

    calls = {"ours": lambda: ours.encode([PROMPT]), "diffusers": theirs}
    return alternate(calls, args.rounds, timer), ours, (hf, tokenizer)


def bench_vae(args, vae_sd, vae_config, device, timer, with_native: bool) -> dict:
    impls = sm.vae_impls(vae_sd, vae_config, device, with_native)
    g = torch.Generator().manual_seed(3)
    size = args.vae_size
    pixels = (torch.rand(1, 3, size, size, generator=g) * 2 - 1).to(device)
    latent = torch.randn(1, 128, size // 16, size // 16, generator=g).to(device)
    enc = alternate({n: (lambda e=e: e(pixels)) for n, (e, _) in impls.items()}, args.rounds, timer)
    dec = alternate({n: (lambda d=d: d(latent)) for n, (_, d) in impls.items()}, args.rounds, timer)
    for r in (enc, dec):  # the three hand back different layouts (normalised / raw, NCHW / NHWC)
        for v in r.values():
            v.pop("max_abs_diff_vs_ours", None)
    return {f"VAE encode {size}²": {"impls": enc}, f"VAE decode {size}²": {"impls": dec}}


def bench_e2e(args, dit_model, diffusers_dit, text, hf_text, vae_sd, vae_config, device, timer) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
    from tiny_vae import make_diffusers_vae

    from flux2_core.sampling import SampleRequest, SampleSettings, sample
    from flux2_core.vae.autoencoder import vae_from_state_dict

    size, steps = args.e2e_size, args.steps
    vae = vae_from_state_dict(vae_sd).to(device)
    diffusers_vae = make_diffusers_vae(vae_sd, vae_config).to(device)
    if hasattr(diffusers_dit, "kv_mode"):
        diffusers_dit.kv_mode(False)
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=diffusers_vae,
        text_encoder=hf_text[0],
        tokenizer=hf_text[1],
        transformer=diffusers_dit.model,
        is_distilled=True,
    )
    pipe.set_progress_bar_config(disable=True)

    def ours():
        latents = sample(
            SampleRequest(dit_model, text.encode([PROMPT]), SampleSettings(size, size, steps, 1.0, 0))
        )
        return vae.decode(latents).clamp(-1, 1).add(1).div(2)

    def theirs():
        return pipe(
            prompt=PROMPT,
            height=size,
            width=size,
            num_inference_steps=steps,
            guidance_scale=1.0,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="pt",
            return_dict=False,
        )[0]

    r = alternate({"ours": ours, "diffusers": theirs}, max(1, args.rounds - 1), timer)
    return {f"end to end {size}², {steps} steps": {"impls": r}}


# ---------------------------------------------------------------------------------------------- loading


def load_probe(args) -> None:
    """In a fresh process: load one implementation's DiT from ``--probe-file`` and report time and VmHWM."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.probe == "native":
        sm.comfy_import(device.type == "cuda", False)
    base_rss, base_hwm = proc_status("VmRSS"), proc_status("VmHWM")
    start = time.perf_counter()
    if args.probe == "ours":
        from flux2_core import load_transformer

        model = load_transformer(args.probe_file, variant="distilled", dtype=dtype, device=device)
    elif args.probe == "diffusers":
        from diffusers import Flux2Transformer2DModel

        model = Flux2Transformer2DModel.from_pretrained(args.probe_file, torch_dtype=dtype).to(device)
    else:
        import comfy.model_management as mm
        import comfy.sd

        model = comfy.sd.load_diffusion_model(args.probe_file, model_options={"dtype": dtype})
        if device.type == "cuda":
            mm.load_models_gpu([model], force_full_load=True)
    sync(device)
    seconds = time.perf_counter() - start
    out = {
        "load_s": seconds,
        "rss_before": base_rss,
        "hwm_before": base_hwm,
        "load_peak_rss": proc_status("VmHWM"),
        "rss_after": proc_status("VmRSS"),
    }
    out["load_peak_rss_above"] = out["load_peak_rss"] - base_rss
    if device.type == "cuda":
        out["vram_after"] = torch.cuda.memory_allocated(device)
    del model
    print("RESULT " + json.dumps(out))


def bench_load(args, diffusers_model, bfl: dict, names: list[str], folder: Path) -> dict:
    from safetensors.torch import save_file

    dit_file = folder / "flux-2-klein-bench.safetensors"
    save_file({k: v.detach().cpu().contiguous() for k, v in bfl.items()}, str(dit_file))
    diffusers_model.save_pretrained(folder / "transformer", safe_serialization=True)
    files = {"ours": dit_file, "native": dit_file, "diffusers": folder / "transformer"}
    out = {}
    for name in names:
        cmd = [
            sys.executable,
            __file__,
            "--probe",
            name,
            "--probe-file",
            str(files[name]),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
        ]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=os.environ)
        line = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
        out[name] = json.loads(line[0][7:]) if line else {"error": run.stderr[-1500:]}
        print(f"  load {name}: {out[name].get('load_s', float('nan')):.2f} s", flush=True)
    out["file_bytes"] = dit_file.stat().st_size
    return out


# ---------------------------------------------------------------------------------------------- report


def cpu_capability() -> str:
    """The vector and matrix units the CPU has (AMX, AVX-512, AVX2, from /proc/cpuinfo's flags) and the
    kernels PyTorch dispatches to on it."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    units = [
        name
        for name, flag in (("AMX", "amx_bf16"), ("AVX-512", "avx512f"), ("AVX2", "avx2"))
        if flag in flags
    ]
    dispatch = torch.backends.cpu.get_cpu_capability()
    return f"{' + '.join(units) or 'none of AVX2 / AVX-512 / AMX'}; torch dispatch {dispatch}"


def machine(device: torch.device) -> dict:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    info = {
        "cpu_capability": cpu_capability(),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    for pkg in ("diffusers", "transformers"):
        info[pkg] = __import__(pkg).__version__
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if os.environ.get("COMFYUI_PATH"):
        info["comfyui_path"] = os.environ["COMFYUI_PATH"]
        try:
            info["comfyui"] = subprocess.run(
                ["git", "-C", os.environ["COMFYUI_PATH"], "describe", "--tags", "--always"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        except OSError:
            pass
    return info


def table(sections: dict) -> list[str]:
    """Markdown rows: per case and implementation the median and min, and the ratios to ours."""
    names = [n for n in IMPLS if any(n in s.get("impls", {}) for s in sections.values())]
    head = "| case | " + " | ".join(f"{n} median / min" for n in names) + " | "
    head += " | ".join(f"{n}/ours median (min)" for n in names if n != "ours") + " | ours GFLOP/s (% peak) |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for case, s in sections.items():
        impls = s.get("impls", {})
        cells = [
            f"{impls[n]['median_s'] * 1000:.0f} / {impls[n]['min_s'] * 1000:.0f} ms" if n in impls else "-"
            for n in names
        ]
        ratios = [
            f"{impls[n]['ratio_median']:.2f} ({impls[n]['ratio_min']:.2f})"
            if "ratio_median" in impls.get(n, {})
            else "-"
            for n in names
            if n != "ours"
        ]
        ours = impls.get("ours", {})
        flops = (
            f"{ours['gflops']:.0f} ({ours['pct_of_matmul_peak']:.0f}%)"
            if ours.get("pct_of_matmul_peak")
            else "-"
        )
        rows.append(f"| {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {flops} |")
    return rows


def memory_table(sections: dict, device: torch.device) -> list[str]:
    """Markdown rows: per case and implementation the peak memory above the start of the call, in MB."""
    names = [n for n in IMPLS if any(n in s.get("impls", {}) for s in sections.values())]
    keys = ["peak_rss_above", "peak_tensors_above"] if device.type == "cpu" else ["peak_vram_above"]
    what = {"peak_rss_above": "RSS", "peak_tensors_above": "tensors", "peak_vram_above": "allocated"}
    head = "| case | " + " | ".join(f"{n} {what[k]} MB" for k in keys for n in names) + " |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for case, s in sections.items():
        impls = s.get("impls", {})
        cells = [f"{impls[n][k] / 2**20:.0f}" if k in impls.get(n, {}) else "-" for k in keys for n in names]
        rows.append(f"| {case} | " + " | ".join(cells) + " |")
    return rows


def plot(dit: dict, title: str) -> str:
    series: dict[str, list] = {}
    for name, s in dit.items():
        case = s["case"]
        if "extract" in name:
            continue
        for impl, r in s["impls"].items():
            key = impl + (" KV cached" if case["kv"] else "")
            tokens = (
                case["text_tokens"] + (case["size"] // 16) ** 2 + case["refs"] * (case["ref_size"] // 16) ** 2
            )
            series.setdefault(key, []).append((tokens, r["median_s"] * 1000, name))
    return line_plot(
        series, title, "tokens attended per step (text + image + references)", "ms per DiT step (median)"
    )


# ---------------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16"], help="float32 on CPU, bf16 on GPU"
    )
    p.add_argument(
        "--gpu-real", action="store_true", help="the real shapes of --shapes at 512² and 1024², on CUDA"
    )
    p.add_argument(
        "--shapes", nargs="+", default=None, choices=list(sm.REAL_SHAPES),
        help="with --gpu-real the real shapes (default klein-4b klein-9b); else the families' medium shapes",
    )  # fmt: skip
    p.add_argument(
        "--real-width", action="store_true",
        help="klein 4B's hidden size, heads and text width (24 heads, text 7680) with 1 + 4 blocks",
    )  # fmt: skip
    p.add_argument("--heads", type=int, default=8, help="medium shape: hidden = heads x 128")
    p.add_argument("--depth", type=int, default=2, help="medium shape: double blocks")
    p.add_argument("--single", type=int, default=8, help="medium shape: single blocks")
    p.add_argument("--text-width", type=int, default=256, help="Qwen3 width (DiT text input = 3x)")
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="text-to-image sides (256 512)")
    p.add_argument("--edit-size", type=int, default=None, help="output side of the edit cases (512)")
    p.add_argument("--ref-size", type=int, default=None, help="reference side (512)")
    p.add_argument("--refs", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--vae-size", type=int, default=None, help="VAE image side (512)")
    p.add_argument("--vae", choices=["medium", "full"], default=None, help="VAE widths: medium (CPU) or full")
    p.add_argument("--e2e-size", type=int, default=None, help="end-to-end image side (256)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="timed rounds after one warm-up each (default 2 on a CPU, else 3)",
    )
    p.add_argument(
        "--native-sdpa", action="store_true", help="native ComfyUI with --use-pytorch-cross-attention"
    )
    p.add_argument("--skip", nargs="*", default=[], choices=["dit", "text", "vae", "e2e", "load", "control"])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--svg", type=Path, default=None)
    p.add_argument(
        "--weights",
        choices=["bf16", "fp8"],
        default="bf16",
        help="fp8: the FLUX.2 DiTs' block linears in float8_e4m3fn (ours and native: scaled, as fp8 files "
        "store them; diffusers: its layerwise casting); the load section is skipped",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="build every model on the meta device, time nothing, and add up the device memory each stage "
        "holds; exits 1 when a stage would not fit --card-gb",
    )
    p.add_argument("--card-gb", type=float, default=None, help="with --dry-run: the card (default: 80)")
    p.add_argument("--probe", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--probe-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    gpu = args.gpu_real or args.device.startswith("cuda")
    if args.gpu_real and not torch.cuda.is_available() and not args.dry_run:
        p.error("--gpu-real needs a CUDA device (or --dry-run, to add up its memory without one)")
    defaults = dict(
        dtype="bfloat16" if gpu else "float32",
        sizes=[512, 1024] if args.gpu_real else [256, 512],
        edit_size=1024 if args.gpu_real else 512,
        ref_size=1024 if args.gpu_real else 512,
        vae_size=1024 if args.gpu_real else 512,
        vae="full" if args.gpu_real else "medium",
        e2e_size=1024 if args.gpu_real else 256,
        rounds=3 if gpu else 2,
        shapes=["klein-4b", "klein-9b"] if args.gpu_real else ["klein-4b"],
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.real_width:  # klein 4B: 24 heads of 128, Qwen3-4B's 2560-wide states x 3
        args.heads, args.depth, args.single, args.text_width = 24, 1, 4, 2560
    return args


def run_shape(args, label: str, config: Flux2Config, device, dtype, peak: float, with_native: bool) -> dict:
    """One FLUX.2 shape, section by section; each implementation's copy goes once no later section needs it,
    and the ledger records what is held at each stage."""
    from tiny_dit import bfl_state_dict
    from tiny_vae import TINY_VAE, random_vae_state_dict

    from flux2_core.vae.autoencoder import FLUX2_VAE

    timer, ledger, dry = Timer(device), Ledger(device), args.dry_run
    print(
        f"{label}: {config.hidden_size} wide, {config.depth}+{config.depth_single_blocks} blocks, "
        f"text {config.context_in_dim}, {args.dtype} on {device}",
        flush=True,
    )
    start = time.perf_counter()
    theirs = sm.build_diffusers_dit(config, device, dtype)
    ledger.stage("diffusers' DiT", theirs)
    bfl = bfl_state_dict(theirs)
    ledger.stage("+ its BFL state dict", theirs, bfl)
    params = sum(p.numel() for p in theirs.parameters())
    print(f"  built {params / 1e6:.0f} M parameters in {time.perf_counter() - start:.1f} s", flush=True)
    out = {"config": vars(config) | {"axes_dim": list(config.axes_dim)}, "parameters": params}
    names = ["ours", "diffusers"] + (["native"] if with_native else [])
    if (
        "load" not in args.skip and args.weights == "bf16"
    ):  # before the others are built: each probe adds its own copy on the device
        ledger.stage("load probe", theirs, bfl, extra=held_bytes(bfl), note="one DiT in the probe's process")
        if not dry:
            with tempfile.TemporaryDirectory() as tmp:
                out["load"] = bench_load(args, theirs, bfl, names, Path(tmp))
    if args.weights == "fp8":  # ours and native from an fp8 file's tensors, diffusers' layerwise fp8
        ledger.stage("quantising to fp8", theirs, bfl, extra=held_bytes(bfl) // 2, note="fp8 copies")
        bfl = sm.fp8_state_dict(bfl)
        sm.fp8_storage(theirs, dtype)
        ledger.stage("fp8 weights", theirs, bfl)
    impls = {"ours": sm.Ours(bfl, device, dtype), "diffusers": sm.Diffusers(theirs)}
    if with_native and not dry:
        impls["native"] = sm.Native(bfl, device, dtype)
    native = held_bytes(bfl) if dry else 0  # native's copy, counted in full when not built
    del bfl, theirs
    tokens = max(c.attended_tokens for c in cases(args, kv=False))
    ledger.stage("DiT cases", *impls.values(), extra=native + step_allowance(config, dtype, tokens))
    if "dit" not in args.skip and not dry:
        out["dit"] = bench_dit(args, config, impls, device, dtype, timer, peak)
    impls.pop("native", None)  # no later section runs native's DiT
    if config.guidance_embed and "control" not in args.skip:  # the Fun ControlNet beside our DiT
        out["control"] = control_section(args, config, impls, ledger, device, dtype, timer, native)
    if "e2e" in args.skip:
        impls.clear()  # nor ours or diffusers'
    release(device)
    out["memory"] = ledger
    if config.guidance_embed:  # FLUX.2 [dev]: its DiT only (the Mistral encoder is timed nowhere here)
        return out
    text = hf_text = None
    ours_text = 0
    if "text" not in args.skip or "e2e" not in args.skip:
        width = config.context_in_dim // 3
        print(f"  text encoder: Qwen3 {width} wide, 28 layers", flush=True)
        r, text, hf_text = bench_text(args, width, device, dtype, timer)
        ours_text = held_bytes(hf_text[0]) if dry else 0  # not built in a dry run: counted as hf's size
        ledger.stage("text encoders", *impls.values(), text, hf_text[0], extra=ours_text)
        if "text" not in args.skip and not dry:
            out["text"] = {"text encode 512 tokens": {"impls": r}}
    vae_config = (
        FLUX2_VAE
        if args.vae == "full"
        else TINY_VAE.__class__(
            ch=64, ch_mult=(1, 2, 4, 4), num_res_blocks=2, decoder_ch=64, decoder_ch_mult=(1, 2, 4, 4)
        )
    )
    vae_sd = random_vae_state_dict(vae_config, seed=4)
    vae_bytes = held_bytes(vae_sd)
    if "vae" not in args.skip:
        print(f"  VAE {args.vae} at {args.vae_size}²", flush=True)
        allowance = ours_text + 3 * vae_bytes + vae_allowance(args.vae_size, torch.float32)
        ledger.stage("VAE", *impls.values(), text, hf_text, extra=allowance, note="three VAEs, float32")
        if not dry:
            out["vae"] = vae_section(args, vae_sd, vae_config, device, timer, with_native)
    if "e2e" not in args.skip:
        print(f"  end to end {args.e2e_size}², {args.steps} steps", flush=True)
        e2e_tokens = (args.e2e_size // 16) ** 2 + 512
        allowance = (
            2 * vae_bytes + step_allowance(config, dtype, e2e_tokens) + vae_allowance(args.e2e_size, dtype)
        )
        ledger.stage("end to end", *impls.values(), text, hf_text, extra=allowance)
        if not dry:
            out["e2e"] = bench_e2e(
                args,
                impls["ours"].model,
                impls["diffusers"],
                text,
                hf_text,
                vae_sd,
                vae_config,
                device,
                timer,
            )
    return out


def control_section(args, config, impls: dict, ledger, device, dtype, timer, native: int) -> dict:
    """FLUX.2 [dev] under the Fun ControlNet: ours plain against ours controlled (strength 0.75, the
    context of the output's tokens), at each t2i size. The control net has one block per two of the
    shape's double blocks (the release: 4 for dev's 8), random, made on the device; the ledger holds it
    beside every DiT of the cases, with the hints of the largest case."""
    from control_cost import random_module

    from flux2_core.dit.control import CONTROL_CHANNELS, Control, ControlConfig, Flux2ControlNet, hint_bytes

    control_config = ControlConfig(
        config.hidden_size, config.num_heads, config.mlp_hidden_dim, config.depth // 2
    )
    net = random_module(lambda: Flux2ControlNet(control_config), device, dtype, seed=1)
    tokens = max(c.attended_tokens for c in cases(args, kv=False))
    grid = max(args.sizes) // 16
    extra = native + step_allowance(config, dtype, tokens) + hint_bytes(control_config, 1, grid * grid, dtype)
    ledger.stage(f"+ Fun ControlNet ({control_config.blocks} blocks)", *impls.values(), net, extra=extra)
    results = {}
    if args.dry_run or "dit" in args.skip:
        return results
    ours = impls["ours"]
    for size in args.sizes:
        case = sm.Case(f"t2i {size}² under the Fun ControlNet", size, ref_size=args.ref_size)
        inp = sm.make_inputs(case, config.context_in_dim, device, dtype, guidance=4.0)
        context = torch.randn(1, case.grid**2, CONTROL_CHANNELS, generator=torch.Generator().manual_seed(3))
        steer = Control(net, context.to(device, dtype), 0.75)
        calls = {"plain": ours.step(case, inp), "controlled": _controlled(ours.net, inp, steer)}
        r = alternate(calls, args.rounds, timer, reference="plain")
        ratio = r["controlled"]["ratio_median"]
        # the table's "ours" column: the controlled step (the plain one is the t2i case of the same size)
        results[case.name] = {"case": vars(case), "impls": {"ours": r["controlled"]}, "plain": r["plain"],
                              "controlled_over_plain": ratio}  # fmt: skip
        print(f"    controlled / plain: {ratio:.3f}x the time", flush=True)
    return results


def _controlled(net, inp, steer):
    g = inp.extra["guidance"]
    return lambda: net(inp.x, inp.our_x_ids, inp.t, inp.ctx, call_extras(guidance=g, control=steer))


def vae_section(args, vae_sd, vae_config, device, timer, with_native: bool) -> dict:
    try:
        return bench_vae(args, vae_sd, vae_config, device, timer, with_native)
    except Exception as exc:  # native's VAE wrapper: report, keep ours vs diffusers
        print(
            f"  native VAE failed ({type(exc).__name__}: {str(exc)[:160]}); ours vs diffusers only",
            flush=True,
        )
        return bench_vae(args, vae_sd, vae_config, device, timer, False)


def release(device: torch.device) -> None:
    """Give the memory of dropped copies back before the next section allocates."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    args = parse_args()
    if args.probe:
        load_probe(args)
        return
    if args.dry_run:
        dry_run(args)
        return
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    with_native = sm.comfy_import(device.type == "cuda", args.native_sdpa)
    if not with_native:
        print("note: COMFYUI_PATH is not set, so native ComfyUI is skipped (set it to a ComfyUI checkout)")
    peak = matmul_peak(device, ["float32", "bfloat16"], quick=False)
    print("matmul peak: " + ", ".join(f"{k} {v['gflops']:.0f} GFLOP/s" for k, v in peak.items()), flush=True)
    report = {
        "machine": machine(device),
        "args": {k: str(v) for k, v in vars(args).items()},
        "matmul_peak": peak,
        "native": with_native,
        "native_attention": "sdpa" if args.native_sdpa else "default",
    }
    print(f"cpu: {report['machine']['cpu']} ({report['machine']['cpu_capability']})", flush=True)
    report["shapes"] = {}
    start = time.perf_counter()
    for label, config in shape_configs(args).items():
        run = run_fill_shape if isinstance(config, Flux1Config) else run_shape
        gflops = peak[args.dtype]["gflops"]
        shape = report["shapes"][label] = run(args, label, config, device, dtype, gflops, with_native)
        shape["memory"] = shape["memory"].stages
        shape["weights"] = args.weights
        release(device)
        save(args.json, report)  # after every shape: a run stopped by a time limit keeps what it finished
    report["total_s"] = time.perf_counter() - start
    report["our_attention"] = {str(k): v for k, v in block_ops.KERNELS.chosen.items()}  # measured choices
    for label, shape in report["shapes"].items():
        sections = {
            **shape.get("dit", {}),
            **shape.get("control", {}),
            **shape.get("text", {}),
            **shape.get("vae", {}),
            **shape.get("e2e", {}),
        }
        print(f"\n{label} ({args.dtype}, {device}), ratio = other / ours (> 1: ours faster)")
        print("\n".join(table(sections)))
        print(f"\npeak memory above the start of each call ({label})")
        print("\n".join(memory_table(shape.get("dit", {}), device)))
        if "load" in shape:
            for name in IMPLS:
                if name in shape["load"] and "load_s" in shape["load"][name]:
                    lr = shape["load"][name]
                    print(
                        f"load {name}: {lr['load_s']:.2f} s, peak RSS {lr['load_peak_rss'] / 2**20:.0f} MB "
                        f"({lr['load_peak_rss_above'] / 2**20:.0f} MB above the start)"
                    )
    print(f"total {report['total_s']:.0f} s")
    save(args.json, report)
    if args.svg:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        label = next(iter(report["shapes"]))
        title = f"FLUX.2 DiT step, {label} shape, {args.dtype} on {device}" + (
            f" ({report['machine']['cpu']}, {report['machine']['affinity']} cores)"
            if device.type == "cpu"
            else ""
        )
        args.svg.write_text(plot(report["shapes"][label].get("dit", {}), title))


def save(path: Path | None, report: dict) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))


def dry_run(args) -> None:
    """``--dry-run``: every shape's models built on the meta device, no call run; the device memory each
    stage would hold is added up and checked against the card."""
    device, dtype = torch.device("meta"), getattr(torch, args.dtype)
    card = card_bytes(torch.device(args.device), args.card_gb)
    report = {
        "dry_run": True,
        "card_bytes": card,
        "headroom": HEADROOM,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    report["shapes"], over = {}, []
    for label, config in shape_configs(args).items():
        run = run_fill_shape if isinstance(config, Flux1Config) else run_shape
        ledger = run(args, label, config, device, dtype, 0.0, False)["memory"]
        print(f"{label}: device memory held at each stage ({args.dtype})")
        print("\n".join(ledger.lines(card)), flush=True)
        report["shapes"][label] = {"stages": ledger.stages, "peak_bytes": ledger.peak}
        if ledger.peak > HEADROOM * card:
            over.append(f"{label} ({ledger.peak / GIB:.1f} GiB)")
    save(args.json, report)
    if over:
        sys.exit(f"does not fit {card / GIB:.0f} GiB: {', '.join(over)}; run those shapes on a larger "
                 "card, or one shape per process with fewer sections (--skip)")  # fmt: skip


if __name__ == "__main__":
    main()
