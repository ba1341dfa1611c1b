"""Our FLUX.2 model in native graphs (Flux2KleinToNativeModel / ToNativeConditioning), on one real server.

Every case runs, in one prompt, three ways on the same weights and seed:

- ours: our loader -> Flux2KleinSampler -> Flux2KleinDecode;
- ours in native: the same loaded model through "FLUX.2 to native MODEL" and our conditioning through
  "FLUX.2 to native CONDITIONING", sampled by native nodes (a guider, KSamplerSelect, a scheduler,
  RandomNoise, EmptyFlux2LatentImage, SamplerCustomAdvanced), decoded by our Decode;
- native: native UNETLoader's own model of the same file through the same native nodes.

With euler and Flux2Scheduler (our sampler's schedule) all three agree within 1/255; with other samplers
and schedulers ours-in-native and native agree within 1/255. Controls show the comparison can fail (another
seed; EasyCache's result differs from the uncached one).
"""

from __future__ import annotations

import re
from io import BytesIO

import numpy as np
import pytest
import torch

SEED, STEPS = 11, 4
PROMPT = "a paper boat on a puddle, city lights, rain"
SIZE = (128, 96)
TOLERANCE = 1  # of 255
DIT = "flux-2-klein-4b.safetensors"


def node(class_type: str, **inputs) -> dict:
    return {"class_type": class_type, "inputs": inputs}


class Graph:
    """An API prompt being built: ``add`` returns the new node's id."""

    def __init__(self):
        self.nodes: dict[str, dict] = {}

    def add(self, class_type: str, **inputs) -> str:
        key = str(len(self.nodes) + 1)
        self.nodes[key] = node(class_type, **inputs)
        return key

    def save(self, image: str, name: str) -> None:
        prefix = f"native_model/{name}"
        self.nodes[f"save_{name}"] = node("SaveImage", images=[image, 0], filename_prefix=prefix)


def base_graph(model_name: str = DIT, variant: str = "distilled", loader: dict | None = None):
    g = Graph()
    ids = {
        "model": g.add("Flux2KleinModelLoader", model_name=model_name, variant=variant, **(loader or {})),
        "te": g.add("Flux2KleinTextEncoderLoader", text_encoder_name="qwen_3_4b.safetensors"),
        "vae": g.add("Flux2KleinVAELoader", vae_name="flux2-vae.safetensors"),
    }
    ids["positive"] = g.add("Flux2KleinTextEncode", text_encoder=[ids["te"], 0], text=PROMPT)
    ids["negative"] = g.add("Flux2KleinTextEncode", text_encoder=[ids["te"], 0], text="")
    ids["native_model"] = g.add("Flux2KleinToNativeModel", model=[ids["model"], 0])
    ids["native_positive"] = g.add("Flux2KleinToNativeConditioning", conditioning=[ids["positive"], 0])
    ids["native_negative"] = g.add("Flux2KleinToNativeConditioning", conditioning=[ids["negative"], 0])
    return g, ids


def ours(g: Graph, ids: dict, name: str, model=None, batch: int = 1, **sampler) -> None:
    settings = dict(positive=[ids["positive"], 0], seed=SEED, steps=STEPS, guidance=1.0, width=SIZE[0],
                    height=SIZE[1], batch_size=batch)  # fmt: skip
    latent = g.add("Flux2KleinSampler", model=[model or ids["model"], 0], **{**settings, **sampler})
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), name)


def native(g: Graph, ids: dict, name: str, model: str, positive: str, negative: str | None = None,
           cfg: float = 1.0, sampler: str = "euler", scheduler: str = "flux2", seed: int = SEED,
           batch: int = 1, steps: int = STEPS) -> None:  # fmt: skip
    """A native sampling chain on ``model`` with a guider (CFGGuider when a negative is given)."""
    if negative is None:
        guider = g.add("BasicGuider", model=[model, 0], conditioning=[positive, 0])
    else:
        guider = g.add("CFGGuider", model=[model, 0], positive=[positive, 0], negative=[negative, 0], cfg=cfg)
    if scheduler == "flux2":
        sigmas = g.add("Flux2Scheduler", steps=steps, width=SIZE[0], height=SIZE[1])
    else:
        sigmas = g.add("BasicScheduler", model=[model, 0], scheduler=scheduler, steps=steps, denoise=1.0)
    latent = g.add(
        "SamplerCustomAdvanced",
        noise=[g.add("RandomNoise", noise_seed=seed), 0],
        guider=[guider, 0],
        sampler=[g.add("KSamplerSelect", sampler_name=sampler), 0],
        sigmas=[sigmas, 0],
        latent_image=[g.add("EmptyFlux2LatentImage", width=SIZE[0], height=SIZE[1], batch_size=batch), 0],
    )
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), name)


def images(comfy, g: Graph) -> dict[str, np.ndarray]:
    entry = comfy.run(g.nodes, timeout=600)
    out = {}
    for node_id, image in comfy.images(entry).items():
        out[node_id.removeprefix("save_")] = np.asarray(image.convert("RGB"), dtype=np.int16)
    return out


def batch_images(comfy, g: Graph) -> dict[str, list[np.ndarray]]:
    from PIL import Image

    entry = comfy.run(g.nodes, timeout=600)
    out: dict[str, list[np.ndarray]] = {}
    for image in comfy.kc.fetch_outputs(entry):
        picture = Image.open(BytesIO(comfy.kc.download_image(comfy.url, image))).convert("RGB")
        out.setdefault(image["node_id"].removeprefix("save_"), []).append(np.asarray(picture, dtype=np.int16))
    return out


def diff(a, b) -> int:
    assert a.shape == b.shape, (a.shape, b.shape)
    return int(np.abs(a - b).max())


def test_native_samplers_on_our_model_give_our_samplers_image(comfy):
    g, ids = base_graph()
    ours(g, ids, "ours")
    native(g, ids, "ours_in_native", ids["native_model"], ids["native_positive"])
    unet = g.add("UNETLoader", unet_name=DIT, weight_dtype="default")
    native(g, ids, "native", unet, ids["native_positive"])
    native(g, ids, "other_seed", ids["native_model"], ids["native_positive"], seed=SEED + 1)
    got = images(comfy, g)
    assert got["ours"].std() > 20
    assert diff(got["ours_in_native"], got["ours"]) <= TOLERANCE
    assert diff(got["ours_in_native"], got["native"]) <= TOLERANCE
    assert np.abs(got["other_seed"] - got["ours"]).mean() > 10  # the comparison can fail


def test_native_sampling_on_our_model_gives_the_diffusers_pipelines_image(comfy):
    """The same weights in diffusers' Flux2KleinPipeline (rebuilt here as the rig built the files), fed the
    prompt embedding of our text encoder (bit-identical to diffusers' Qwen3 path, test_text_encoder.py)."""
    import sys

    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
    from tiny_dit import make_diffusers_dit
    from tiny_vae import make_diffusers_vae, random_vae_state_dict

    from flux2_core import load_text_encoder
    from flux2_core.vae.autoencoder import VAEConfig

    rig = sys.modules[type(comfy).__module__]  # the integration conftest: how the files were made
    spec = dict(rig.DIT_FILES[DIT])
    dit = rig.sharpen_attention(make_diffusers_dit(spec.pop("seed"), **rig.DIT_SHAPE, **spec))
    vae_config = VAEConfig(ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, decoder_ch=32)
    vae_sd = random_vae_state_dict(vae_config, seed=301)
    vae_sd = {k: v if k.startswith("bn.") else v.to(torch.bfloat16).float() for k, v in vae_sd.items()}
    embeds = load_text_encoder(comfy.models["qwen_3_4b.safetensors"]).encode([PROMPT])
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=make_diffusers_vae(vae_sd, vae_config), text_encoder=None, tokenizer=None, transformer=dit,
        is_distilled=True,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        theirs = pipe(prompt_embeds=embeds, height=SIZE[1], width=SIZE[0], num_inference_steps=STEPS,
                      guidance_scale=1.0, generator=torch.Generator("cpu").manual_seed(SEED),
                      output_type="np").images[0]  # fmt: skip
    theirs = np.clip(theirs * 255.0, 0, 255).astype(np.int16)  # as SaveImage writes a float image
    g, ids = base_graph()
    native(g, ids, "ours_in_native", ids["native_model"], ids["native_positive"])
    got = images(comfy, g)["ours_in_native"]
    assert got.std() > 20
    assert diff(got, theirs) <= 3


def test_base_model_with_cfg_guider_and_an_empty_negative(comfy):
    g, ids = base_graph("flux-2-klein-base-4b.safetensors", "base")
    ours(g, ids, "ours", guidance=3.0, negative=[ids["negative"], 0])
    native(g, ids, "ours_in_native", ids["native_model"], ids["native_positive"], ids["native_negative"], 3.0)
    native(g, ids, "cfg_1", ids["native_model"], ids["native_positive"], ids["native_negative"], 1.0)
    got = images(comfy, g)
    assert diff(got["ours_in_native"], got["ours"]) <= TOLERANCE
    assert np.abs(got["cfg_1"] - got["ours"]).mean() > 3  # the guidance scale reaches the image


def test_two_reference_edit_through_reference_latent(comfy):
    g, ids = base_graph()
    pictures = [comfy.upload((112, 80)), comfy.upload((64, 80))]
    loads = [g.add("LoadImage", image=p) for p in pictures]
    refs = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[loads[0], 0], max_megapixels=1.0)
    refs = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[loads[1], 0], references=[refs, 0],
                 max_megapixels=1.0)  # fmt: skip
    ours(g, ids, "ours", references=[refs, 0])
    positive = ids["native_positive"]
    for load in loads:  # our encode node's latents, as the graph has them
        latent = g.add("Flux2KleinEncode", vae=[ids["vae"], 0], image=[load, 0])
        positive = g.add("ReferenceLatent", conditioning=[positive, 0], latent=[latent, 0])
    native(g, ids, "ours_in_native", ids["native_model"], positive)
    native(g, ids, "no_references", ids["native_model"], ids["native_positive"])
    got = images(comfy, g)
    assert diff(got["ours_in_native"], got["ours"]) <= TOLERANCE
    assert np.abs(got["no_references"] - got["ours"]).mean() > 3  # the references reach the image


def test_a_batch_of_two(comfy):
    g, ids = base_graph()
    ours(g, ids, "ours", batch=2)
    native(g, ids, "ours_in_native", ids["native_model"], ids["native_positive"], batch=2)
    got = batch_images(comfy, g)
    assert len(got["ours"]) == len(got["ours_in_native"]) == 2
    for a, b in zip(got["ours"], got["ours_in_native"]):
        assert diff(a, b) <= TOLERANCE
    assert np.abs(got["ours"][0] - got["ours"][1]).mean() > 10  # two images, not one twice


@pytest.mark.parametrize(
    "sampler, scheduler", [("euler", "simple"), ("dpmpp_2m", "flux2"), ("res_multistep", "beta")]
)
def test_other_samplers_and_schedulers_match_native_model(comfy, sampler, scheduler):
    g, ids = base_graph("flux-2-klein-base-4b.safetensors", "base")
    unet = g.add("UNETLoader", unet_name="flux-2-klein-base-4b.safetensors", weight_dtype="default")
    native_positive, native_negative = ids["native_positive"], ids["native_negative"]
    for name, model in (("ours_in_native", ids["native_model"]), ("native", unet)):
        native(g, ids, name, model, native_positive, native_negative, 2.5, sampler, scheduler, steps=6)
    got = images(comfy, g)
    assert got["native"].std() > 20
    assert diff(got["ours_in_native"], got["native"]) <= TOLERANCE


def test_easycache_skips_steps_on_our_model_as_on_native(comfy):
    g, ids = base_graph()
    unet = g.add("UNETLoader", unet_name=DIT, weight_dtype="default")
    cache = dict(reuse_threshold=0.8, start_percent=0.1, end_percent=0.95, verbose=False)
    cached_ours = g.add("EasyCache", model=[ids["native_model"], 0], **cache)
    cached_native = g.add("EasyCache", model=[unet, 0], **cache)
    before = comfy.log()
    for name, model in (("ours", cached_ours), ("native", cached_native), ("uncached", ids["native_model"])):
        native(g, ids, name, model, ids["native_positive"], steps=12)
    got = images(comfy, g)
    log = comfy.log()[len(before) :]
    skipped = [int(n) for n in re.findall(r"EasyCache - skipped (\d+)/\d+ steps", log)]
    assert len(skipped) == 2 and skipped[0] == skipped[1] > 0, log[-2000:]
    assert diff(got["ours"], got["native"]) <= TOLERANCE
    assert np.abs(got["ours"] - got["uncached"]).mean() > 0.1  # the skipped steps changed the image


def test_torch_compile_model_on_our_model_gives_the_uncompiled_image(comfy):
    # native TorchCompileModel compiles the MODEL's diffusion model (our DiT inside NativeDiT) with inductor
    g, ids = base_graph()
    compiled = g.add("TorchCompileModel", model=[ids["native_model"], 0], backend="inductor")
    native(g, ids, "compiled", compiled, ids["native_positive"])
    native(g, ids, "eager", ids["native_model"], ids["native_positive"])
    native(g, ids, "other_seed", compiled, ids["native_positive"], seed=SEED + 1)
    got = images(comfy, g)
    assert got["eager"].std() > 20
    assert diff(got["compiled"], got["eager"]) <= TOLERANCE
    assert np.abs(got["other_seed"] - got["compiled"]).mean() > 10  # the comparison can fail


def test_lazycache_on_our_model_gives_natives_result(comfy):
    g, ids = base_graph()
    unet = g.add("UNETLoader", unet_name=DIT, weight_dtype="default")
    cache = dict(reuse_threshold=0.8, start_percent=0.1, end_percent=0.95, verbose=False)
    before = comfy.log()
    for name, model in (("ours", ids["native_model"]), ("native", unet)):
        native(g, ids, name, g.add("LazyCache", model=[model, 0], **cache), ids["native_positive"], steps=12)
    native(g, ids, "uncached", ids["native_model"], ids["native_positive"], steps=12)
    got = images(comfy, g)
    skipped = [int(n) for n in re.findall(r"LazyCache - skipped (\d+)/\d+ steps", comfy.log()[len(before) :])]
    assert len(skipped) == 2 and skipped[0] == skipped[1] > 0, skipped
    assert diff(got["ours"], got["native"]) <= TOLERANCE
    assert np.abs(got["ours"] - got["uncached"]).mean() > 0.1


def test_kv_model_through_reference_latent_and_dev_through_flux_guidance(comfy):
    """9B-KV: ReferenceLatent references served from our cached K/V; dev: FluxGuidance's value embedded."""
    g, ids = base_graph("flux-2-klein-9b-kv.safetensors", "kv")
    g.nodes[ids["te"]]["inputs"]["text_encoder_name"] = "qwen_3_8b.safetensors"
    load = g.add("LoadImage", image=comfy.upload((96, 64)))
    refs = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[load, 0], max_megapixels=1.0)
    ours(g, ids, "kv_ours", references=[refs, 0])
    latent = g.add("Flux2KleinEncode", vae=[ids["vae"], 0], image=[load, 0])
    positive = g.add("ReferenceLatent", conditioning=[ids["native_positive"], 0], latent=[latent, 0])
    native(g, ids, "kv_in_native", ids["native_model"], positive)
    native(g, ids, "kv_no_references", ids["native_model"], ids["native_positive"])
    # FLUX.2 [dev] in the same prompt
    dev = g.add("Flux2KleinModelLoader", model_name="flux2-dev.safetensors", variant="dev")
    dev_te = g.add("Flux2KleinTextEncoderLoader", text_encoder_name="mistral_3_small_flux2_bf16.safetensors")
    dev_text = g.add("Flux2KleinTextEncode", text_encoder=[dev_te, 0], text=PROMPT)
    dev_ids = {**ids, "positive": dev_text}
    ours(g, dev_ids, "dev_ours", model=dev, guidance=4.0)
    dev_native = g.add("Flux2KleinToNativeModel", model=[dev, 0])
    dev_cond = g.add("Flux2KleinToNativeConditioning", conditioning=[dev_text, 0])
    for name, value in (("dev_in_native", 4.0), ("dev_other_guidance", 1.5)):
        guided = g.add("FluxGuidance", conditioning=[dev_cond, 0], guidance=value)
        native(g, ids, name, dev_native, guided)
    got = images(comfy, g)
    assert diff(got["kv_in_native"], got["kv_ours"]) <= TOLERANCE
    assert np.abs(got["kv_no_references"] - got["kv_ours"]).mean() > 3
    assert diff(got["dev_in_native"], got["dev_ours"]) <= TOLERANCE
    assert np.abs(got["dev_other_guidance"] - got["dev_ours"]).mean() > 1  # the guidance value reaches it


@pytest.mark.parametrize(
    "case",
    ["fp8", "gguf", "stream", "lora"],
)
def test_loading_options_survive_native_sampling(comfy, case):
    """fp8 and GGUF files kept quantised, a streamed model and a LoRA: native sampling on our MODEL equals our
    sampler on the same loaded model, and a native KSampler runs it like native's own model would."""
    model_name, loader = DIT, {}
    if case == "fp8":
        model_name = "flux-2-klein-4b-fp8.safetensors"
    elif case == "gguf":
        model_name = "flux-2-klein-4b-Q8_0.gguf"
    elif case == "stream":
        loader = {"offload": "stream", "resident_mb": 0}
    g, ids = base_graph(model_name, loader=loader)
    model = ids["model"]
    if case == "lora":
        model = g.add("Flux2KleinLoraLoader", model=[model, 0], lora_name="flux-2-klein-4b-lora.safetensors",
                      strength=1.0)  # fmt: skip
        ids["native_model"] = g.add("Flux2KleinToNativeModel", model=[model, 0])
        ours(g, ids, "plain")
    ours(g, ids, "ours", model=model)
    native(g, ids, "ours_in_native", ids["native_model"], ids["native_positive"])
    latent = g.add("EmptyFlux2LatentImage", width=SIZE[0], height=SIZE[1], batch_size=1)
    ksampled = g.add(
        "KSampler", model=[ids["native_model"], 0], positive=[ids["native_positive"], 0],
        negative=[ids["native_negative"], 0], latent_image=[latent, 0], seed=SEED, steps=STEPS, cfg=1.0,
        sampler_name="euler", scheduler="simple", denoise=1.0,
    )  # fmt: skip
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[ksampled, 0]), "ksampler")
    native(g, ids, "simple", ids["native_model"], ids["native_positive"], scheduler="simple")
    got = images(comfy, g)
    assert got["ours"].std() > 20
    assert diff(got["ours_in_native"], got["ours"]) <= TOLERANCE
    assert diff(got["ksampler"], got["simple"]) <= TOLERANCE  # KSampler = the same schedule run natively
    if case == "lora":
        assert np.abs(got["plain"] - got["ours"]).mean() > 1  # the LoRA reaches native sampling


def test_native_weight_patches_and_block_patches_are_refused_clearly(comfy):
    g, ids = base_graph()
    lora = g.add("LoraLoaderModelOnly", model=[ids["native_model"], 0],
                 lora_name="flux-2-klein-4b-lora.safetensors", strength_model=1.0)  # fmt: skip
    native(g, ids, "lora", lora, ids["native_positive"])
    with pytest.raises(comfy.kc.ExecutionFailed) as failure:
        comfy.run(g.nodes, timeout=300)
    data = failure.value.data
    assert data["node_type"] == "LoraLoaderModelOnly" and data["exception_type"] == "Flux2Error", data
    assert "FLUX.2 LoRA Loader" in data["exception_message"]


def test_native_sampling_reports_progress_and_stops_on_interrupt(comfy):
    import json
    import time
    import uuid

    kc = comfy.kc
    assert kc.websocket is not None, "websocket-client is needed for this test"
    wf = kc.prepare_workflow(
        comfy.api_workflow("flux2_klein_4b_native_sampler"), prompt="never finished", seed=5,
        sets=["Flux2Scheduler.steps=300", "Flux2Scheduler.width=512", "Flux2Scheduler.height=512",
              "EmptyFlux2LatentImage.width=512", "EmptyFlux2LatentImage.height=512"],
    )  # fmt: skip
    (sampler,) = kc.nodes_of_type(wf, "SamplerCustomAdvanced")
    client_id = uuid.uuid4().hex
    ws = kc.connect_ws(comfy.url, client_id)
    try:
        prompt_id = kc.queue(comfy.url, wf, client_id)
        progress, deadline = None, time.monotonic() + 120
        while progress is None and time.monotonic() < deadline:
            try:
                message = ws.recv()
            except kc.websocket.WebSocketTimeoutException:
                continue
            event = json.loads(message) if isinstance(message, str) else {}
            data = event.get("data") or {}
            ours = data.get("prompt_id") == prompt_id and data.get("node") == sampler
            if ours and event["type"] == "progress":
                progress = data
        assert progress is not None and progress["max"] == 300, "no progress from the native sampler"
        interrupted_at = time.monotonic()
        assert comfy.post_json("/interrupt", {"prompt_id": prompt_id})[0] == 200
        with pytest.raises(kc.Interrupted):
            kc.wait(comfy.url, prompt_id, ws, timeout=120)
        assert time.monotonic() - interrupted_at < 60
    finally:
        ws.close()
    kinds = [kind for kind, _ in comfy.finished_history(prompt_id)["status"]["messages"]]
    assert "execution_interrupted" in kinds and "execution_error" not in kinds, kinds


def test_reference_strengths_reach_native_sampling_through_the_conditioning_bridge(comfy):
    # references from our Reference Encode (at 0.5 over every step, then at 2 for the first half), handed to
    # native sampling by FLUX.2 to native CONDITIONING: native's run equals our sampler's with the same ones
    g, ids = base_graph()
    load = g.add("LoadImage", image=comfy.upload((112, 80)))
    for name, weight in (
        ("half", dict(strength=0.5)),
        ("early", dict(strength=2.0, end=0.5)),
        ("off", dict(strength=0.0)),
    ):
        refs = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[load, 0], **weight)
        ours(g, ids, f"ours_{name}", references=[refs, 0])
        bridged = g.add(
            "Flux2KleinToNativeConditioning", conditioning=[ids["positive"], 0], references=[refs, 0]
        )
        native(g, ids, f"native_{name}", ids["native_model"], bridged)
    plain = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[load, 0])
    ours(g, ids, "ours_plain", references=[plain, 0])
    native(g, ids, "no_references", ids["native_model"], ids["native_positive"])
    got = images(comfy, g)
    for name in ("half", "early", "off"):
        assert diff(got[f"native_{name}"], got[f"ours_{name}"]) <= TOLERANCE, name
    assert diff(got["native_off"], got["no_references"]) == 0  # strength 0: the text-to-image call
    assert np.abs(got["ours_half"] - got["ours_plain"]).mean() > 1  # the strength changes the picture
    assert np.abs(got["ours_early"] - got["ours_half"]).mean() > 1


def regional_chain(g: Graph, ids: dict) -> str:
    """Two regions (the left and the right half) chained onto the global prompt."""
    te = [ids["te"], 0]
    canvas = g.add("SolidMask", value=0.0, width=SIZE[0], height=SIZE[1])
    half = g.add("SolidMask", value=1.0, width=SIZE[0] // 2, height=SIZE[1])
    left = g.add("MaskComposite", destination=[canvas, 0], source=[half, 0], x=0, y=0, operation="add")
    right = g.add("InvertMask", mask=[left, 0])
    chain = ids["positive"]
    for text, mask in (("a red door", left), ("a blue window", right)):
        encoded = g.add("Flux2KleinTextEncode", text_encoder=te, text=text)
        chain = g.add(
            "Flux2KleinRegionalPrompt", region=[encoded, 0], mask=[mask, 0], conditioning=[chain, 0]
        )
    return chain


def test_regional_prompts_reach_native_sampling_through_the_conditioning_bridge(comfy):
    g, ids = base_graph()
    chain = regional_chain(g, ids)
    latent = g.add("Flux2KleinSampler", model=[ids["model"], 0], positive=[chain, 0], seed=SEED, steps=STEPS,
                   guidance=1.0, width=SIZE[0], height=SIZE[1], batch_size=1)  # fmt: skip
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), "ours_regional")
    bridged = g.add("Flux2KleinToNativeConditioning", conditioning=[chain, 0])
    native(g, ids, "native_regional", ids["native_model"], bridged)
    ours(g, ids, "ours_plain")
    got = images(comfy, g)
    assert diff(got["native_regional"], got["ours_regional"]) <= TOLERANCE
    assert np.abs(got["ours_regional"] - got["ours_plain"]).mean() > 1  # the regions change the picture


@pytest.mark.parametrize(
    "model_name, variant, text_encoder",
    [
        (DIT, "distilled", "qwen_3_4b.safetensors"),
        ("flux-2-klein-9b-kv.safetensors", "kv", "qwen_3_8b.safetensors"),  # the references' K/V cached
    ],
)
def test_regions_with_references_reach_native_sampling_through_the_conditioning_bridge(
    comfy, model_name, variant, text_encoder
):
    # the regional chain and a reference at 0.5 together, handed to native sampling by FLUX.2 to native
    # CONDITIONING: native's run equals our sampler's with both; each of the two changes the picture
    g, ids = base_graph(model_name, variant)
    g.nodes[ids["te"]]["inputs"]["text_encoder_name"] = text_encoder
    chain = regional_chain(g, ids)
    load = g.add("LoadImage", image=comfy.upload((112, 80)))
    refs = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[load, 0], strength=0.5)
    ours(g, ids, "ours_regional_edit", positive=[chain, 0], references=[refs, 0])
    bridged = g.add("Flux2KleinToNativeConditioning", conditioning=[chain, 0], references=[refs, 0])
    native(g, ids, "native_regional_edit", ids["native_model"], bridged)
    ours(g, ids, "ours_edit", references=[refs, 0])
    ours(g, ids, "ours_regional", positive=[chain, 0])
    got = images(comfy, g)
    assert diff(got["native_regional_edit"], got["ours_regional_edit"]) <= TOLERANCE
    assert np.abs(got["ours_regional_edit"] - got["ours_edit"]).mean() > 1  # the regions act
    assert np.abs(got["ours_regional_edit"] - got["ours_regional"]).mean() > 1  # the reference acts


def test_a_negative_zeroed_from_the_regional_conditioning_runs_unmasked_on_its_own_text(comfy):
    # ConditioningZeroOut copies the entry's options, regions included: the negative pass must still be the
    # zeroed text, unmasked (else it equals the positive one and CFG does nothing)
    g, ids = base_graph("flux-2-klein-base-4b.safetensors", "base")
    chain = regional_chain(g, ids)
    bridged = g.add("Flux2KleinToNativeConditioning", conditioning=[chain, 0])
    zeroed = g.add("ConditioningZeroOut", conditioning=[bridged, 0])
    native(g, ids, "zeroed_regional", ids["native_model"], bridged, zeroed, 3.0)
    plain_zero = g.add("ConditioningZeroOut", conditioning=[ids["native_positive"], 0])
    native(g, ids, "zeroed_plain", ids["native_model"], bridged, plain_zero, 3.0)
    negative = g.add("Flux2KleinFromNativeConditioning", conditioning=[plain_zero, 0])
    ours(g, ids, "ours", positive=[chain, 0], negative=[negative, 0], guidance=3.0)
    native(g, ids, "cfg_1", ids["native_model"], bridged, zeroed, 1.0)
    got = images(comfy, g)
    assert diff(got["zeroed_regional"], got["zeroed_plain"]) == 0
    assert diff(got["zeroed_regional"], got["ours"]) <= TOLERANCE
    assert np.abs(got["cfg_1"] - got["ours"]).mean() > 3  # the guidance reaches the image


def test_native_reference_latents_added_after_ours_count_at_one(comfy):
    # a reference at 0.5 from our bridge, then one from native ReferenceLatent: our sampler's run of the same
    # two, the second plain
    g, ids = base_graph()
    pictures = [comfy.upload((112, 80)), comfy.upload((64, 80))]
    loads = [g.add("LoadImage", image=p) for p in pictures]
    weak = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[loads[0], 0], strength=0.5)
    both = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[loads[1], 0], references=[weak, 0])
    ours(g, ids, "ours", references=[both, 0])
    bridged = g.add("Flux2KleinToNativeConditioning", conditioning=[ids["positive"], 0], references=[weak, 0])
    latent = g.add("Flux2KleinEncode", vae=[ids["vae"], 0], image=[loads[1], 0])
    positive = g.add("ReferenceLatent", conditioning=[bridged, 0], latent=[latent, 0])
    native(g, ids, "native", ids["native_model"], positive)
    plain = g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0], image=[loads[0], 0])
    ours(g, ids, "ours_plain", references=[g.add("Flux2KleinReferenceEncode", vae=[ids["vae"], 0],
                                                 image=[loads[1], 0], references=[plain, 0]), 0])  # fmt: skip
    got = images(comfy, g)
    assert diff(got["native"], got["ours"]) <= TOLERANCE
    assert np.abs(got["ours"] - got["ours_plain"]).mean() > 1  # the first one's strength reaches the image


def test_position_extrapolation_under_native_samplers_is_our_samplers_option(comfy):
    """FLUX.2 Position Extrapolation on the bridged model, sampled natively (euler, Flux2Scheduler), gives the
    FLUX.2 Sampler's image with position_extrapolation dype; past the base it differs from the plain one."""
    size = {"width": 320, "height": 256}  # past a base of 256 px on the width
    g, ids = base_graph()
    for name, method in (("ours_dype", "dype"), ("ours_off", "off")):
        latent = g.add("Flux2KleinSampler", model=[ids["model"], 0], positive=[ids["positive"], 0], seed=SEED,
                       steps=STEPS, guidance=1.0, batch_size=1, position_extrapolation=method,
                       extrapolation_base=256, **size)  # fmt: skip
        g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), name)
    patched = g.add("Flux2KleinPositionExtrapolation", model=[ids["native_model"], 0],
                    position_extrapolation="dype", extrapolation_base=256)  # fmt: skip
    latent = g.add(
        "SamplerCustomAdvanced",
        noise=[g.add("RandomNoise", noise_seed=SEED), 0],
        guider=[g.add("BasicGuider", model=[patched, 0], conditioning=[ids["native_positive"], 0]), 0],
        sampler=[g.add("KSamplerSelect", sampler_name="euler"), 0],
        sigmas=[g.add("Flux2Scheduler", steps=STEPS, **size), 0],
        latent_image=[g.add("EmptyFlux2LatentImage", batch_size=1, **size), 0],
    )
    g.save(g.add("Flux2KleinDecode", vae=[ids["vae"], 0], latent=[latent, 0]), "native_dype")
    got = images(comfy, g)
    assert got["ours_dype"].std() > 20
    assert diff(got["native_dype"], got["ours_dype"]) <= TOLERANCE
    assert np.abs(got["ours_dype"] - got["ours_off"]).mean() > 1  # the comparison can fail
