"""A schedule given as sigmas, and LoRAs on FLUX.2 [dev], against native ComfyUI on one real server.

- The sampler's ``sigmas`` input fed by native ``ManualSigmas`` runs the list as native ``ManualSigmas`` +
  ``SamplerCustomAdvanced`` (euler, RandomNoise) runs it on our model through the bridge ("FLUX.2 to native
  MODEL" / "FLUX.2 to native CONDITIONING"), for klein and dev.
- A dev LoRA in the BFL layout native reads (``diffusion_model.<BFL name>.lora_A/B``, ``.alpha`` on some
  modules, every linear of the DiT: blocks, embedders, the guidance embedder, the three modulations and the
  final layer) through our LoRA Loader on our dev model equals native ``LoraLoaderModelOnly`` on native's
  own dev model (UNETLoader of the same tiny file). The same change written in fal's trainer layout
  (``base_model.model.``, no alpha), which native does not read, applies through ours as the BFL file does.

- A LoRA of dev's Mistral text encoder in ComfyUI's spellings changes the image through the loader's
  ``text_encoder`` output, and (in a child process of ComfyUI's Python, no server) the same weights as
  ComfyUI's own key map and merge.

Images agree within 1/255; controls show each comparison can fail (the list changes the image, the LoRA
changes the image, native's run of the fal file is its plain image).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from comfy_server import DEV_DIT, DEV_TEXT_ENCODER, VAE_FILE
from test_native_model import Graph, diff, images

SEED = 13
SIZE = (128, 96)
TOLERANCE = 1  # of 255
SIGMAS = "1.0, 0.9, 0.62, 0.3, 0.08, 0.0"  # five steps, not any scheduler's list
STEPS = 5  # the sampler's own schedule of as many steps: the control
DEV_GUIDANCE = 4.0
STRENGTH = 0.8
RANK = 4
BFL_LORA, FAL_LORA = "flux2-dev-test-lora-bfl.safetensors", "flux2-dev-test-lora-fal.safetensors"
PROMPT = "a red kite above a green hill, watercolour"
MODELS = {
    "klein": ("flux-2-klein-4b.safetensors", "distilled", "qwen_3_4b.safetensors", 1.0),
    "dev": (DEV_DIT, "dev", DEV_TEXT_ENCODER, DEV_GUIDANCE),
}


def loaded(g: Graph, family: str) -> dict:
    """Our loaders, the prompt encoded, the bridge's model and conditioning (dev: FluxGuidance's value)."""
    model_name, variant, te_name, guidance = MODELS[family]
    ids = {"model": g.add("Flux2KleinModelLoader", model_name=model_name, variant=variant)}
    te = g.add("Flux2KleinTextEncoderLoader", text_encoder_name=te_name)
    ids["vae"] = g.add("Flux2KleinVAELoader", vae_name=VAE_FILE)
    ids["positive"] = g.add("Flux2KleinTextEncode", text_encoder=[te, 0], text=PROMPT)
    ids["native_model"] = g.add("Flux2KleinToNativeModel", model=[ids["model"], 0])
    positive = g.add("Flux2KleinToNativeConditioning", conditioning=[ids["positive"], 0])
    if family == "dev":
        positive = g.add("FluxGuidance", conditioning=[positive, 0], guidance=guidance)
    ids["native_positive"], ids["guidance"] = positive, guidance
    return ids


def ours(g: Graph, ids: dict, name: str, model: str | None = None, **sampler) -> None:
    settings = dict(positive=[ids["positive"], 0], seed=SEED, steps=STEPS, guidance=ids["guidance"],
                    width=SIZE[0], height=SIZE[1], batch_size=1)  # fmt: skip
    latent = g.add("Flux2KleinSampler", model=[model or ids["model"], 0], **{**settings, **sampler})
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), name)


def native(g: Graph, ids: dict, name: str, model: str, sigmas: str) -> None:
    """Native sampling of ``model``: BasicGuider, RandomNoise, euler, the given SIGMAS, our Decode."""
    latent = g.add(
        "SamplerCustomAdvanced",
        noise=[g.add("RandomNoise", noise_seed=SEED), 0],
        guider=[g.add("BasicGuider", model=[model, 0], conditioning=[ids["native_positive"], 0]), 0],
        sampler=[g.add("KSamplerSelect", sampler_name="euler"), 0],
        sigmas=[sigmas, 0],
        latent_image=[g.add("EmptyFlux2LatentImage", width=SIZE[0], height=SIZE[1], batch_size=1), 0],
    )
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), name)


@pytest.mark.parametrize("family", ["klein", "dev"])
def test_the_sigmas_input_runs_a_list_as_native_manual_sigmas_does(comfy, family):
    g = Graph()
    ids = loaded(g, family)
    manual = g.add("ManualSigmas", sigmas=SIGMAS)
    ours(g, ids, "ours", sigmas=[manual, 0])
    native(g, ids, "native", ids["native_model"], manual)
    ours(g, ids, "own_schedule")  # the sampler's own schedule of as many steps
    got = images(comfy, g)
    effect = np.abs(got["ours"] - got["own_schedule"]).mean()
    print(f"\n[{family}] max |ours - native| = {diff(got['ours'], got['native'])}/255, "  # noqa: T201
          f"mean |list - own schedule| = {effect:.1f}/255")  # fmt: skip
    assert got["ours"].std() > 20, got["ours"].std()
    assert diff(got["ours"], got["native"]) <= TOLERANCE
    assert effect > 1, "the list did not reach the sampler"


# --- a dev LoRA on every linear of the DiT


def _lora_tensors(dit_file) -> tuple[dict, dict]:
    """The BFL file (alpha 2 of rank 4 on every other module) and the fal file of the same change (no
    alpha: its up halves carry the factor), both on every 2-D weight of the dev DiT."""
    from safetensors import safe_open

    g = torch.Generator().manual_seed(1701)
    bfl, fal = {}, {}
    with safe_open(str(dit_file), "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    weights = [k for k, shape in shapes.items() if k.endswith(".weight") and len(shape) == 2]
    layers = sorted(k.removesuffix(".weight") for k in weights)
    for i, layer in enumerate(layers):
        out_features, in_features = shapes[layer + ".weight"]
        down = torch.randn(RANK, in_features, generator=g) * 0.15
        up = torch.randn(out_features, RANK, generator=g) * 0.15
        bfl[f"diffusion_model.{layer}.lora_A.weight"] = down
        bfl[f"diffusion_model.{layer}.lora_B.weight"] = up
        scale = 1.0
        if i % 2:
            bfl[f"diffusion_model.{layer}.alpha"] = torch.tensor(2.0)
            scale = 2.0 / RANK
        fal[f"base_model.model.{layer}.lora_A.weight"] = down
        fal[f"base_model.model.{layer}.lora_B.weight"] = up * scale
    return bfl, fal


@pytest.fixture(scope="module")
def dev_loras(comfy) -> int:
    """Both files in the server's loras folder; the number of modules each changes."""
    from safetensors.torch import save_file

    bfl, fal = _lora_tensors(comfy.models[DEV_DIT])
    folder = comfy.base / "models" / "loras"
    save_file({k: v.contiguous() for k, v in bfl.items()}, str(folder / BFL_LORA))
    save_file({k: v.contiguous() for k, v in fal.items()}, str(folder / FAL_LORA))
    return len(fal) // 2


def test_a_dev_lora_through_our_loader_equals_native_lora_loader_on_natives_dev_model(comfy, dev_loras):
    g = Graph()
    ids = loaded(g, "dev")
    schedule = g.add("Flux2Scheduler", steps=3, width=SIZE[0], height=SIZE[1])
    unet = g.add("UNETLoader", unet_name=DEV_DIT, weight_dtype="default")
    reports = {}
    for name, lora in (("bfl", BFL_LORA), ("fal", FAL_LORA)):
        reports[name] = g.add(
            "Flux2KleinLoraLoader", model=[ids["model"], 0], lora_name=lora, strength=STRENGTH
        )
        ours(g, ids, f"ours_{name}", model=reports[name], steps=3)
        patched = g.add("LoraLoaderModelOnly", model=[unet, 0], lora_name=lora, strength_model=STRENGTH)
        native(g, ids, f"native_{name}", patched, schedule)
    ours(g, ids, "ours_plain", steps=3)
    native(g, ids, "native_plain", unet, schedule)
    before = comfy.log()
    entry = comfy.run(g.nodes, timeout=600)
    log = comfy.log()[len(before) :]
    got = {k.removeprefix("save_"): np.asarray(v.convert("RGB"), dtype=np.int16)
           for k, v in comfy.images(entry).items()}  # fmt: skip
    print(  # noqa: T201
        f"\nmax |ours - native|: plain {diff(got['ours_plain'], got['native_plain'])}/255, BFL LoRA "
        f"{diff(got['ours_bfl'], got['native_bfl'])}/255; max |ours fal - ours BFL| = "
        f"{diff(got['ours_fal'], got['ours_bfl'])}/255; mean |LoRA - plain| = "
        f"{np.abs(got['ours_bfl'] - got['ours_plain']).mean():.1f}/255"
    )
    assert got["ours_bfl"].std() > 20, got["ours_bfl"].std()
    assert diff(got["ours_plain"], got["native_plain"]) <= TOLERANCE  # the same model on both sides
    assert diff(got["ours_bfl"], got["native_bfl"]) <= TOLERANCE
    assert np.abs(got["ours_bfl"] - got["ours_plain"]).mean() > 1, "the LoRA barely changes the image"
    # fal's layout: native reads none of it (its image is the plain one); ours applies the same change
    assert "lora key not loaded: base_model.model." in log, log[-2000:]
    assert diff(got["native_fal"], got["native_plain"]) == 0
    assert diff(got["ours_fal"], got["ours_bfl"]) <= TOLERANCE
    for name, node_id in reports.items():
        (text,) = entry["outputs"][node_id]["text"]
        assert f"{dev_loras} of the file's {dev_loras} modules applied here" in text, (name, text)


def test_a_mistral_text_encoder_lora_through_the_loaders_text_encoder_output(comfy):
    """A LoRA of dev's text encoder only, in ComfyUI's spellings: connected through the loader's
    ``text_encoder`` input and output it changes the prompt's encoding and so the image; the model output
    alone (no text encoder connected) draws the plain image and the report says why."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(77)
    tensors = {}
    for i in range(0, 30, 3):  # the server's tiny Mistral: 16 wide, 2 heads of 128, MLP 37
        q = f"text_encoders.mistral3_24b.transformer.model.layers.{i}.self_attn.q_proj"
        tensors |= {q + ".lora_B.weight": torch.randn(256, RANK, generator=g) * 0.5,
                    q + ".lora_A.weight": torch.randn(RANK, 16, generator=g) * 0.5}  # fmt: skip
        down = f"lora_te_layers_{i}_mlp_down_proj"
        tensors |= {down + ".lora_up.weight": torch.randn(16, RANK, generator=g) * 0.5,
                    down + ".lora_down.weight": torch.randn(RANK, 37, generator=g) * 0.5,
                    down + ".alpha": torch.tensor(2.0)}  # fmt: skip
    name = "flux2-dev-test-text-encoder-lora.safetensors"
    save_file(tensors, str(comfy.base / "models" / "loras" / name))
    graph = Graph()
    ids = loaded(graph, "dev")
    te = graph.nodes[ids["positive"]]["inputs"]["text_encoder"]
    lora = graph.add("Flux2KleinLoraLoader", model=[ids["model"], 0], lora_name=name, strength=1.0,
                     text_encoder=te)  # fmt: skip
    alone = graph.add("Flux2KleinLoraLoader", model=[ids["model"], 0], lora_name=name, strength=1.0)
    ours(graph, ids, "plain", steps=3)
    ours(graph, ids, "model_only", model=alone, steps=3)
    encoded = graph.add("Flux2KleinTextEncode", text_encoder=[lora, 2], text=PROMPT)
    ours(graph, {**ids, "positive": encoded}, "text_encoder_lora", model=lora, steps=3)
    entry = comfy.run(graph.nodes, timeout=600)
    got = {k.removeprefix("save_"): np.asarray(v.convert("RGB"), dtype=np.int16)
           for k, v in comfy.images(entry).items()}  # fmt: skip
    (report,) = entry["outputs"][lora]["text"]
    assert f"text encoder: {len(tensors) * 2 // 5} modules applied" in report, report
    (unconnected,) = entry["outputs"][alone]["text"]
    assert "not applied (no text encoder connected)" in unconnected, unconnected
    assert diff(got["model_only"], got["plain"]) == 0
    assert np.abs(got["text_encoder_lora"] - got["plain"]).mean() > 1, "the text-encoder LoRA did nothing"


# --- a Mistral text-encoder LoRA in ComfyUI's layouts, against ComfyUI's own LoRA code (no server)

TE_CHILD = r"""
import json, sys
sys.path[:0] = json.loads(sys.stdin.readline())
te_file, lora_file, out_file, strength = json.loads(sys.stdin.readline())
sys.argv = ["comfyui", "--cpu"]
import comfy.options
comfy.options.enable_args_parsing()
import comfy.lora
import comfy.utils
from safetensors.torch import load_file, save_file

PREFIX = "mistral3_24b.transformer."  # the weights of dev's text encoder in ComfyUI's CLIP model
sd = {PREFIX + k: v for k, v in load_file(te_file).items() if k.startswith("model.")}

class TextEncoderWeights:  # what model_lora_keys_clip reads of the model: its state dict's names
    def state_dict(self):
        return sd

key_map = comfy.lora.model_lora_keys_clip(TextEncoderWeights(), {})
patches = comfy.lora.load_lora(comfy.utils.load_torch_file(lora_file), key_map)
merged = {}
for key, adapter in patches.items():
    weight = sd[key].float().clone()
    merged[key[len(PREFIX + "model."):]] = comfy.lora.calculate_weight([(strength, adapter, 1.0, None, None)],
                                                                        weight, key).contiguous()
save_file(merged, out_file)
print("RESULT " + json.dumps(sorted(merged)))
"""


def test_a_mistral_text_encoder_lora_changes_the_weights_comfyuis_lora_code_changes(tmp_path):
    """Every ComfyUI spelling of a dev text-encoder LoRA (``text_encoders.mistral3_24b.transformer.model.``,
    ``text_encoders.transformer.model.``, ``lora_te_layers_N_``, alpha or none): ComfyUI's own key map and
    merge (``model_lora_keys_clip``, ``load_lora``, ``calculate_weight``, run by ComfyUI's Python on the tiny
    Mistral's weights under ComfyUI's names) and our patches give the same weights, on the same layers."""
    import json
    import os
    import subprocess
    import sys

    from comfy_server import REPO
    from safetensors.torch import load_file, save_file
    from tiny_dit import make_diffusers_dit, write_bfl_file
    from tiny_mistral import TINY_TEXT_HEAD_128, make_tiny_mistral3, v7_tekken_json
    from tiny_mistral import write_comfy_file as write_mistral

    from flux2_core.dit.files import load_transformer
    from flux2_core.lora import TE, patched, prepare_lora, read_lora
    from flux2_core.text.encoder import load_text_encoder

    heads = {k: TINY_TEXT_HEAD_128[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
    mistral = make_tiny_mistral3(seed=31, **heads)
    te_file = write_mistral(mistral, tmp_path / "te.safetensors", v7_tekken_json(), layers=30, lm_head=False)
    encoder = load_text_encoder(te_file)
    layers = dict(encoder.model.named_modules())
    g = torch.Generator().manual_seed(32)
    tensors = {}
    for key, layer, alpha in [
        ("text_encoders.mistral3_24b.transformer.model.layers.0.self_attn.q_proj", "q_proj", 2.0),
        ("text_encoders.transformer.model.layers.7.mlp.down_proj", "down_proj", None),
        ("lora_te_layers_3_self_attn_k_proj", "k_proj", 8.0),
        ("lora_te_layers_29_mlp_up_proj", "up_proj", None),
    ]:
        target = layers[next(n for n in layers if n.endswith(layer))]  # each kind has one shape
        tensors[key + ".lora_up.weight"] = torch.randn(target.out_features, RANK, generator=g) * 0.3
        tensors[key + ".lora_down.weight"] = torch.randn(RANK, target.in_features, generator=g) * 0.3
        if alpha is not None:
            tensors[key + ".alpha"] = torch.tensor(alpha)
    save_file(tensors, str(tmp_path / "lora.safetensors"))
    dit = write_bfl_file(
        make_diffusers_dit(seed=33, guidance_embeds=True), tmp_path / "flux2-dev.safetensors"
    )
    transformer = load_transformer(dit).transformer
    ours = prepare_lora(read_lora(tmp_path / "lora.safetensors"), transformer, encoder.model, STRENGTH)

    paths = [os.environ["COMFYUI_PATH"], str(REPO)]
    job = [str(te_file), str(tmp_path / "lora.safetensors"), str(tmp_path / "native.safetensors"), STRENGTH]
    stdin = "\n".join(json.dumps(v) for v in (paths, job)) + "\n"
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    run = subprocess.run([python, "-c", TE_CHILD], input=stdin, capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    native = load_file(str(tmp_path / "native.safetensors"))
    names = {k.removesuffix(".weight") for k in native}
    assert len(names) == 4 and names == set(ours.patches[TE]), (sorted(names), sorted(ours.patches[TE]))
    with patched(encoder.model, TE, [ours]):
        for name in names:
            mine = layers[name].compute_weight(torch.float32, torch.device("cpu"))
            torch.testing.assert_close(mine, native[name + ".weight"], atol=1e-6, rtol=1e-6)
