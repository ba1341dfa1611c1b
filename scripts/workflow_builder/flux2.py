"""The FLUX.2 workflows (klein 4B / 9B / 9B-KV, FLUX.2 [dev]): one recipe each, one graph builder for all,
and the note each workflow carries. Columns run from left to right, in the direction the data flows: the
models (and a LoRA), the prompts, the reference images and the image to edit, the sampler, the decode."""

from __future__ import annotations

from .graph import Graph, Node
from .layout import (
    AUTO_TILES,
    GENERATE,
    IMAGE_TITLES,
    LOADER_SIZE,
    MODELS,
    PROMPT,
    SEED,
    finish,
    image_column,
    load_image,
    loaders,
    outpaint_pad,
    prompt,
)
from .models import models_property
from .notes import CONTROL_FILE, note, short_note
from .recipe import Family, Mode, Recipe, Sampling
from .schemas import FILES

VAE_FILE = "flux2-vae.safetensors"
STRENGTH = ("strength", "start", "end")  # Reference Encode's widgets for how much a reference counts


def build(r: Recipe) -> Graph:
    g = Graph(r.name, r.title, note(r))
    model, te, te_slot, vae = _models(g, r)
    positive, negative = _prompts(g, r, te, te_slot)
    if r.regions:
        positive = _regions(g, r, te, te_slot, positive)
    refs = _references(g, r, vae)
    control = _control(g, r, vae, positive) if r.control else None
    if control is not None:
        positive = control
    tiles = {"tile_size": r.decode_tile, "tile_overlap": 64} if r.decode_tile else AUTO_TILES
    if r.mode is Mode.UPSCALE:
        refine = _upscale(g, r, model, positive, negative, vae)
        finish(g, "Flux2KleinDecode", vae, refine, None, "flux2_klein", short_note(r), tiles)
        return g
    if r.sampling is not Sampling.OURS:
        sampler = _native_sampling(g, r, model, positive, negative)
        finish(g, "Flux2KleinDecode", vae, sampler, None, "flux2_klein", short_note(r))
        return g
    sampler = _sampler(g, r, model, positive, negative)
    stitch = _edit_inputs(g, r, vae, refs, sampler, control)
    if refs is not None and stitch is None:
        g.connect(refs, sampler, "references")
    prefix = "flux2_dev" if r.family is Family.DEV else "flux2_klein"
    stitched = None if stitch is None else (stitch, 2)
    finish(g, "Flux2KleinDecode", vae, sampler, stitched, prefix, short_note(r), tiles)
    return g


def _models(g: Graph, r: Recipe) -> tuple[Node, Node, int, Node]:
    """The loaders, and a LoRA loader the model and text encoder pass through when the recipe has one:
    (model, text encoder node, its output slot, VAE)."""
    model_values = {"model_name": r.dit, "variant": r.variant, "weight_dtype": "default", "offload": "none",
                    "resident_mb": 0, "devices": "", "quant_compute": "auto"}  # fmt: skip
    model, te, vae = loaders(
        g,
        ("Flux2KleinModelLoader", LOADER_SIZE, model_values, (r.dit,)),
        ("Flux2KleinTextEncoderLoader", LOADER_SIZE,
         {"text_encoder_name": r.text_encoder, "device": "default"}, (r.text_encoder,)),
        ("Flux2KleinVAELoader", LOADER_SIZE, {"vae_name": VAE_FILE}, (VAE_FILE,)),
    )  # fmt: skip
    if r.lora is None:
        return model, te, 0, vae
    download = {"properties": {"models": models_property(r.lora)}} if r.lora in FILES else {}
    lora = g.add(
        "Flux2KleinLoraLoader",
        MODELS,
        LOADER_SIZE,
        {"lora_name": r.lora, "strength": r.lora_strength, "block_strengths": ""},
        **download,
    )
    g.connect(model, lora, "model")
    g.connect(te, lora, "text_encoder")
    report = g.add("PreviewAny", MODELS, (290, 160), title="LoRA report")
    g.connect(lora, report, "source", src_slot=1)
    g.group("LoRA", lora, report)
    return lora, lora, 2, vae


def _prompts(g: Graph, r: Recipe, te: Node, te_slot: int) -> tuple[Node, Node | None]:
    positive = prompt(g, "Flux2KleinTextEncode", r.prompt, te, te_slot)
    negative = None
    if r.negative is not None:
        negative = prompt(g, "Flux2KleinTextEncode", r.negative, te, te_slot, negative=True)
    g.group("Prompt", *[n for n in (positive, negative) if n is not None])
    return positive, negative


def _regions(g: Graph, r: Recipe, te: Node, te_slot: int, positive: Node) -> Node:
    """The left and right halves as masks (Create Solid Mask, Combine Masks, Invert Mask), a prompt for each
    and FLUX.2 Regional Prompt chained onto the global prompt; returns the last Regional Prompt."""
    size = 1024  # any size: the sampler scales each mask to its latent grid
    masks = regions = image_column(r.references)  # the masks, then the Regional Prompts below them
    canvas = g.add("SolidMask", masks, (270, 100), {"value": 0.0, "width": size, "height": size})
    half = g.add("SolidMask", masks, (270, 100), {"value": 1.0, "width": size // 2, "height": size})
    left = g.add("MaskComposite", masks, (270, 100), {"x": 0, "y": 0, "operation": "add"}, title="Left half")
    g.connect(canvas, left, "destination")
    g.connect(half, left, "source")
    right = g.add("InvertMask", masks, (270, 30), title="Right half")
    g.connect(left, right, "mask")
    g.group("Region masks", canvas, half, left, right)  # the note says how to replace them
    chain, texts, nodes = positive, [], []
    for i, text in enumerate(r.regions):
        texts.append(g.add("Flux2KleinTextEncode", PROMPT, (400, 200), {"text": text},
                           title=f"Region {i + 1} prompt"))  # fmt: skip
        g.connect(te, texts[-1], "text_encoder", src_slot=te_slot)
    for i, (encode, mask) in enumerate(zip(texts, (left, right))):
        region = g.add(
            "Flux2KleinRegionalPrompt", regions, (270, 100), {"strength": 1.0}, title=f"Region {i + 1}"
        )
        g.connect(encode, region, "region")
        g.connect(mask, region, "mask")
        g.connect(chain, region, "conditioning")
        chain = region
        nodes.append(region)
    g.group("Region prompts", *texts)
    g.group("Regions", *nodes)
    return chain


def _references(g: Graph, r: Recipe, vae: Node) -> Node | None:
    """One column per reference image (Load Image over Reference Encode), chained; returns the last encode."""
    refs, nodes = None, []
    for i in range(r.references):
        what = f" ({r.reference_titles[i]})" if i < len(r.reference_titles) else ""
        if i == 0 and r.references > 1 and not what:
            what = " (sets the output size)"
        image = load_image(g, image_column(i), f"Reference image {i + 1}{what}")
        weight = r.reference_strengths[i] if r.reference_strengths else (1.0, 0.0, 1.0)
        values = {"max_megapixels": 1.0, "resize": "crop", **AUTO_TILES, **dict(zip(STRENGTH, weight))}
        enc = g.add(
            "Flux2KleinReferenceEncode", image_column(i), (270, 130), values, title=f"Reference {i + 1}"
        )
        g.connect(vae, enc, "vae")
        g.connect(image, enc, "image")
        if refs is not None:
            g.connect(refs, enc, "references")
        refs = enc
        nodes += [image, enc]
    if nodes:
        g.group("References" if r.references > 1 else "Reference", *nodes)
    return refs


def _control(g: Graph, r: Recipe, vae: Node, positive: Node) -> Node:
    """The Fun ControlNet: its loader below the models, the control map's Load Image and FLUX.2 [dev]
    Apply ControlNet on the prompt; returns the Apply node (the sampler's positive)."""
    col = image_column(r.references + (1 if r.mode is not Mode.GENERATE else 0))
    loader = g.add("Flux2DevControlNetLoader", MODELS, LOADER_SIZE,
                   {"control_net_name": CONTROL_FILE, "quant_compute": "auto", "offload": "none"},
                   properties={"models": models_property(CONTROL_FILE)})  # fmt: skip
    image = load_image(g, col, f"Control map ({r.control})")
    values = {"strength": r.control_strength, "start": 0.0, "end": 1.0}
    apply = g.add("Flux2DevApplyControlNet", col, (270, 200), values, title="Apply ControlNet")
    g.connect(positive, apply, "conditioning")
    g.connect(loader, apply, "control_net")
    g.connect(vae, apply, "vae")
    g.connect(image, apply, "control_image")
    g.group("ControlNet", loader)
    g.group(f"Control ({r.control} map)", image, apply)
    return apply


def _sampler(g: Graph, r: Recipe, model: Node, positive: Node, negative: Node | None) -> Node:
    values = {"seed": SEED, "steps": r.steps, "guidance": r.guidance, "width": r.width, "height": r.height,
              "batch_size": 1, "denoise": r.denoise, "kv_cache": "reuse", "step_cache": 0.0,
              "position_extrapolation": r.position_extrapolation, "extrapolation_base": 2048}  # fmt: skip
    sampler = g.add("Flux2KleinSampler", GENERATE, (270, 300), values)
    g.connect(model, sampler, "model")
    g.connect(positive, sampler, "positive")
    if negative is not None:
        g.connect(negative, sampler, "negative")
    if r.sigmas is not None:  # the schedule as a list, below the prompt
        sigmas = g.add("ManualSigmas", PROMPT, (400, 60), {"sigmas": r.sigmas}, title="Schedule (sigmas)")
        g.connect(sigmas, sampler, "sigmas")
    return sampler


def _edit_inputs(
    g: Graph, r: Recipe, vae: Node, refs: Node | None, sampler: Node, control: Node | None = None
) -> Node | None:
    """The image to start from (img2img) or to inpaint / outpaint; returns the Inpaint Prepare node. Under a
    control net the image and its mask also feed its inpaint mode, and stand in for the reference."""
    if r.mode is Mode.GENERATE:
        return None
    col = image_column(r.references)
    image = load_image(g, col, IMAGE_TITLES[r.mode])
    if r.mode is Mode.IMG2IMG:
        encode = g.add("Flux2KleinEncode", col, (270, 60))
        g.connect(vae, encode, "vae")
        g.connect(image, encode, "image")
        g.connect(encode, sampler, "latent")
        g.group("Image to start from", image, encode)
        return None
    nodes, source, mask, mask_slot = [image], image, image, 1  # Load Image's MASK: its transparent pixels
    if r.mode is Mode.OUTPAINT:
        pad = outpaint_pad(g, image, col)
        nodes.append(pad)
        source, mask = pad, pad
    prepare = g.add(
        "Flux2KleinInpaintPrepare",
        col,
        (270, 180),
        {"grow_mask": 0 if r.mode is Mode.OUTPAINT else 4, "crop_to_mask": False, "context": 64},
    )
    g.connect(vae, prepare, "vae")
    g.connect(source, prepare, "image")
    g.connect(mask, prepare, "mask", src_slot=mask_slot)
    if refs is not None:
        g.connect(refs, prepare, "references")
    g.connect(prepare, sampler, "latent")
    if control is None:
        g.connect(prepare, sampler, "references", src_slot=1)
    else:  # the control net sees the picture around the mask; no reference tokens to pay for
        g.connect(source, control, "image")
        g.connect(mask, control, "mask", src_slot=mask_slot)
    g.group(f"Image to {r.mode}", *nodes, prepare)
    return prepare


def _native_sampling(g: Graph, r: Recipe, model: Node, positive: Node, negative: Node | None) -> Node:
    """Our model and prompts through the bridges into native sampling: a guider (CFG with a negative prompt,
    else basic), KSamplerSelect, Flux2Scheduler, RandomNoise, an empty FLUX.2 latent, SamplerCustomAdvanced;
    EasyCache on the model for ``Sampling.NATIVE_EASYCACHE``. Returns the sampler (its output: the latent)."""
    to_model = g.add("Flux2KleinToNativeModel", "native", (270, 60))
    g.connect(model, to_model, "model")
    bridges, native_model = [to_model], to_model
    if r.sampling is Sampling.NATIVE_EASYCACHE:
        values = {"reuse_threshold": 0.2, "start_percent": 0.15, "end_percent": 0.95, "verbose": False}
        # its settings are the workflow's point: shown in Nodes 2.0 too
        native_model = g.add("EasyCache", "native", (270, 130), values, show_advanced=True)
        g.connect(to_model, native_model, "model")
        bridges.append(native_model)
    conds = []
    for text in [positive] + ([negative] if negative is not None else []):
        cond = g.add("Flux2KleinToNativeConditioning", "native", (270, 60))
        g.connect(text, cond, "conditioning")
        conds.append(cond)
    g.group("Into native nodes", *bridges, *conds)
    if negative is None:
        guider = g.add("BasicGuider", "native2", (270, 60))
        g.connect(native_model, guider, "model")
        g.connect(conds[0], guider, "conditioning")
    else:
        guider = g.add("CFGGuider", "native2", (270, 100), {"cfg": r.guidance})
        g.connect(native_model, guider, "model")
        g.connect(conds[0], guider, "positive")
        g.connect(conds[1], guider, "negative")
    noise = g.add("RandomNoise", "native2", (270, 80), {"noise_seed": SEED})
    select = g.add("KSamplerSelect", "native2", (270, 60), {"sampler_name": "euler"})
    sigmas = g.add("Flux2Scheduler", "native2", (270, 100),
                   {"steps": r.steps, "width": r.width, "height": r.height})  # fmt: skip
    latent = g.add("EmptyFlux2LatentImage", GENERATE, (270, 100),
                   {"width": r.width, "height": r.height, "batch_size": 1})  # fmt: skip
    sampler = g.add("SamplerCustomAdvanced", GENERATE, (270, 100))
    g.group("Sampling", guider, noise, select, sigmas)
    for source, name in ((noise, "noise"), (guider, "guider"), (select, "sampler"), (sigmas, "sigmas"),
                         (latent, "latent_image")):  # fmt: skip
        g.connect(source, sampler, name)
    return sampler


def _upscale(g: Graph, r: Recipe, model: Node, positive: Node, negative: Node | None, vae: Node) -> Node:
    """The image enlarged by native Upscale Image By (Lanczos), refined by FLUX.2 Tiled Refine (returned)."""
    col = image_column(0)
    image = load_image(g, col, IMAGE_TITLES[r.mode])
    values = {"upscale_method": "lanczos", "scale_by": r.upscale}
    scale = g.add("ImageScaleBy", col, (270, 90), values)
    g.connect(image, scale, "image")
    g.group("Image to enlarge", image, scale)
    values = {"seed": SEED, "steps": r.steps, "denoise": r.denoise, "tile_size": 1024, "tile_overlap": 128,
              "guidance": r.guidance}  # fmt: skip
    refine = g.add("Flux2KleinTiledRefine", GENERATE, (270, 300), values)
    g.connect(model, refine, "model")
    g.connect(positive, refine, "positive")
    g.connect(vae, refine, "vae")
    g.connect(scale, refine, "image")
    if negative is not None:
        g.connect(negative, refine, "negative")
    return refine
