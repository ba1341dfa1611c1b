"""The FLUX.2 workflows, one recipe each: klein 4B text-to-image (distilled, base), editing with one and
several references, img2img, inpaint, outpaint, LoRA, 9B-KV editing, and FLUX.2 [dev] text-to-image and
multi-reference editing."""

from __future__ import annotations

from .recipe import Family, Mode, Recipe, Sampling

FOX = (
    "A red fox curled up in fresh snow at sunrise, soft golden backlight, frost on its fur, "
    "shallow depth of field, wildlife photography"
)
DISTILLED_SETTINGS = (
    "Distilled model: **4 steps, guidance 1.0** (no CFG, one model pass per step, so no negative prompt). "
    "More steps rarely help. Width and height: multiples of 16, about 1–4 megapixels."
)
EDIT_SIZE = (
    "Width and height are **0**, which means *the size of the first reference image* (after it is scaled to "
    "at most `max_megapixels`, 1.0 by default, and to multiples of 16). Set them to a number to force a size."
)

# the model, its text encoder and their default steps and guidance, shared by the recipes of each model
KLEIN_4B = dict(
    dit="flux-2-klein-4b.safetensors", text_encoder="qwen_3_4b.safetensors", variant="distilled", steps=4,
    guidance=1.0,
)  # fmt: skip
KLEIN_4B_BASE = dict(
    dit="flux-2-klein-base-4b.safetensors", text_encoder="qwen_3_4b.safetensors", variant="base", steps=50,
    guidance=4.0,
)  # fmt: skip

RECIPES = (
    Recipe(
        name="flux2_klein_4b_lora",
        title="FLUX.2 [klein] 4B: text to image with a LoRA",
        summary="Text to image with the distilled klein 4B model and a LoRA on top (its report shown).",
        **KLEIN_4B,
        prompt=FOX,
        settings=DISTILLED_SETTINGS,
        lora="flux-2-klein-4b-lora.safetensors",
    ),
    Recipe(
        name="flux2_klein_4b_text_to_image",
        title="FLUX.2 [klein] 4B: text to image",
        summary="Text to image with the distilled klein 4B model (Apache-2.0), the fastest klein.",
        **KLEIN_4B,
        prompt=FOX,
        settings=DISTILLED_SETTINGS,
    ),
    Recipe(
        name="flux2_klein_4b_base_text_to_image",
        title="FLUX.2 [klein] 4B base: text to image",
        summary=(
            "Text to image with the undistilled klein 4B **base** model: slower (real classifier-free "
            "guidance, two model passes per step) but more varied; the model to fine-tune or train LoRAs on."
        ),
        **KLEIN_4B_BASE,
        prompt=FOX,
        negative="",
        settings=(
            "Base model: **about 50 steps, guidance 4.0** (true CFG). The negative prompt is used; "
            "an empty one is the usual choice. Fewer steps (20–30) give usable drafts."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_edit",
        title="FLUX.2 [klein] 4B: edit an image",
        summary=(
            "Edits one image following the prompt, with the distilled klein 4B model. "
            "Load your image in *Reference image 1*."
        ),
        **KLEIN_4B,
        prompt=(
            "Turn this drawing into a photograph: a young woman with blonde hair in a pink dress standing on "
            "a green meadow under a blue sky with white clouds. Keep the pose and the composition."
        ),
        references=1,
        width=0,
        height=0,
        settings=f"{DISTILLED_SETTINGS}\n\n{EDIT_SIZE}",
    ),
    Recipe(
        name="flux2_klein_4b_multi_reference_edit",
        title="FLUX.2 [klein] 4B: combine several reference images",
        summary=(
            "Combines four reference images following the prompt (refer to them as image 1, 2, 3, 4), with "
            "the distilled klein 4B model. The references are chained: each *Reference Encode* adds one "
            "image, with its own pixel budget (`max_megapixels`) and fit (`crop`, or `resize` to keep the "
            "whole picture). For more references, copy a *Load Image* + *Reference Encode* pair and chain "
            "it (the sampler refuses, before it starts, a set that will not fit in memory); for fewer, "
            "bypass (Ctrl+B) the last pairs' *Reference Encode* nodes or delete them."
        ),
        **KLEIN_4B,
        prompt=(
            "The person from image 1 wearing the outfit from image 2 and the hat from image 4, standing "
            "in the place shown in image 3. Natural light, photorealistic."
        ),
        references=4,
        width=0,
        height=0,
        settings=f"{DISTILLED_SETTINGS}\n\n{EDIT_SIZE} Every extra reference makes each step slower.",
    ),
    Recipe(
        name="flux2_klein_4b_edit_reference_strength",
        title="FLUX.2 [klein] 4B: two references, each with its own strength",
        summary=(
            "Edits with two references that count differently, with the distilled klein 4B model: "
            "*Reference 1* (the subject) at strength **1.0**, *Reference 2* (the style) at **0.5** and only "
            "for the first 75% of the steps. A reference's `strength` scales its share of the model's "
            "attention: 1 is the plain edit, 0 ignores the reference (the text-to-image result), above 1 "
            "follows it more closely; `start` and `end` (fractions of the steps) limit when it counts. Try "
            "0.3-0.8 on a style reference that takes over the picture."
        ),
        **KLEIN_4B,
        prompt=(
            "The cat from image 1 sitting on a windowsill, painted in the style of image 2: loose brush "
            "strokes, warm evening colours."
        ),
        references=2,
        width=0,
        height=0,
        reference_strengths=((1.0, 0.0, 1.0), (0.5, 0.0, 0.75)),
        reference_titles=("subject", "style"),
        settings=(
            f"{DISTILLED_SETTINGS}\n\n{EDIT_SIZE}\n\nThe strengths work on every model (base, 9B-KV, dev), "
            "with LoRAs, quantised files, streaming and both parallel modes; in native sampling graphs they "
            "travel through *FLUX.2 to native CONDITIONING*'s `references` input."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_regional_prompt",
        title="FLUX.2 [klein] 4B: a prompt per region",
        summary=(
            "Text to image with a global prompt for the whole picture and a prompt for each half, with "
            "the distilled klein 4B model. Each *FLUX.2 Regional Prompt* puts its prompt where its mask is "
            "white: the region's text reaches only the image inside the mask, while the whole picture reads "
            "the global prompt and stays one coherent image. The masks here are the left and right halves; "
            "replace them with *Load Image (as Mask)* (its `channel` is `alpha` by default: pick `red` for "
            "an opaque black-and-white image) or paint your own (any size: they are stretched to the "
            "picture). Chain "
            "more regions onto the last one; `strength` (1 = plain) sets how much a region's prompt counts."
        ),
        **KLEIN_4B,
        prompt="A cosy living room in the evening, warm lamp light, photograph",
        regions=(
            "a ginger cat asleep on a green velvet armchair",
            "a tall bookshelf full of old books and a potted fern",
        ),
        settings=(
            f"{DISTILLED_SETTINGS}\n\nWith reference images (an edit), see `flux2_klein_4b_regional_edit`; "
            "the negative prompt of base models stays one plain prompt (its pass is not masked)."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_regional_edit",
        title="FLUX.2 [klein] 4B: edit with a prompt per region",
        summary=(
            "Edits an image with a prompt for the whole picture and one for each half, with the distilled "
            "klein 4B model: *Reference image 1* is the photo to edit, each *FLUX.2 Regional Prompt* puts "
            "its "
            "prompt where its mask is white, and the global prompt says what to keep. Every part of the "
            "picture reads the reference (at its strength and step range); the reference reads the global "
            "prompt but no region's, so a region's prompt reaches only the image inside its mask. The masks "
            "here are the left and right halves; replace them with *Load Image (as Mask)* or your own (any "
            "size: they are stretched to the picture)."
        ),
        **KLEIN_4B,
        prompt=(
            "The same room, light and people as in image 1, photographed the same way; only their coats "
            "change."
        ),
        regions=(
            "the person on the left wearing a long red wool coat",
            "the person on the right wearing a blue denim jacket",
        ),
        references=1,
        width=0,
        height=0,
        settings=(
            f"{DISTILLED_SETTINGS}\n\n{EDIT_SIZE}\n\nA region's `strength` (1 = plain) sets how much its "
            "prompt "
            "counts, the reference's `strength` how much the photo does; more references chain onto "
            "*Reference 1* as in the multi-reference workflow."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_refcontrol_depth",
        title="FLUX.2 [klein] 4B base: structure from a depth map (RefControl)",
        summary=(
            "Puts the subject of one image into the pose and layout of a depth map, with the klein 4B "
            "**base** model and the RefControl depth LoRA (`flux2_klein_4b_refcontrol_depth.safetensors` "
            "in `models/loras`). *Reference image 1* is the **depth map** (it also sets the output size: "
            "make it at about 1 megapixel, e.g. a preprocessor's resolution 1024, framed as the picture "
            "should be), *Reference image 2* the **subject**; the prompt starts with the trigger word "
            "`refcontrol`. "
            "Depth maps come from a preprocessor pack (Depth Anything or MiDaS nodes, e.g. "
            "comfyui_controlnet_aux) or from any depth image; the LoRA's siblings for pose, canny, lineart "
            "and normal maps (9B) work the same way."
        ),
        **KLEIN_4B_BASE,
        prompt=(
            "refcontrol, apply depth from image 1 with reference from image 2: the person from image 2 in "
            "the layout of image 1, same clothes and face, studio light"
        ),
        negative="",
        references=2,
        width=0,
        height=0,
        lora="flux2_klein_4b_refcontrol_depth.safetensors",
        reference_titles=("depth map", "subject"),
        lora_strength=0.9,
        settings=(
            "Base model: **about 50 steps, CFG 4.0** with an empty negative prompt; RefControl LoRA at "
            "**0.8-1.0** (0.9 here), the strengths its model card recommends for klein base. The depth "
            "map's strength can be set on its Reference Encode (`strength`, "
            "`end`) like any reference's.\n\n" + EDIT_SIZE
        ),
    ),
    Recipe(
        name="flux2_klein_9b_kv_edit",
        title="FLUX.2 [klein] 9B-KV: fast reference editing",
        summary=(
            "Edits with one or two reference images using the klein **9B-KV** model, which computes the "
            "references' attention keys/values once and reuses them at every step, so editing costs little "
            "more than text to image. With the sampler's `kv_cache` on `reuse` (the default) they are also "
            "kept across runs: queue again with a new prompt or seed and the references are not processed "
            "again (same image as a fresh run; changing a reference, the model or its precision computes "
            "them anew). For a single reference, bypass (Ctrl+B) or delete *Reference 2*."
        ),
        dit="flux-2-klein-9b-kv.safetensors",
        text_encoder="qwen_3_8b.safetensors",
        variant="kv",
        steps=4,
        guidance=1.0,
        prompt=(
            "Put the person from image 1 in the clothes from image 2. Keep the face, the pose and the "
            "background of image 1."
        ),
        references=2,
        width=0,
        height=0,
        settings=(
            "9B-KV is distilled: **4 steps, guidance 1.0**. The 9B models need the Qwen3-8B text encoder "
            "(`qwen_3_8b.safetensors`) and are under the FLUX non-commercial licence.\n\n" + EDIT_SIZE
        ),
    ),
)


RECIPES += (
    Recipe(
        name="flux2_klein_4b_img2img",
        title="FLUX.2 [klein] 4B: image to image",
        summary=(
            "Redraws an image following the prompt, keeping its layout and colours: the sampler starts from "
            "the image's latent instead of pure noise. Load your image in *Image to start from*."
        ),
        **KLEIN_4B,
        prompt="A watercolour painting of the same scene, soft washes of colour, paper texture.",
        width=0,
        height=0,
        mode=Mode.IMG2IMG,
        denoise=0.75,
        settings=(
            f"{DISTILLED_SETTINGS}\n\n**denoise** sets how much changes: 1 ignores the image, lower keeps "
            "more of it (0.75 skips the first of the 4 steps, 0.5 the first two). The output takes the "
            "image's size, centre-cropped to multiples of 16."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_inpaint",
        title="FLUX.2 [klein] 4B: inpaint",
        summary=(
            "Repaints the masked part of an image following the prompt and puts the result back over the "
            "original, so every pixel outside the mask stays exactly as it was. Load the image in *Image to "
            "inpaint*, then right-click it and choose *Open in MaskEditor* to paint the area to repaint."
        ),
        **KLEIN_4B,
        prompt="A small wooden table with a vase of red tulips.",
        width=0,
        height=0,
        mode=Mode.INPAINT,
        settings=(
            f"{DISTILLED_SETTINGS}\n\n*Inpaint Prepare* grows the mask by `grow_mask` pixels and passes the "
            "image to the sampler twice: as the latent to keep outside the mask and as reference 1. With "
            "`crop_to_mask` on, only the mask's box plus `context` pixels is sampled, enlarged up to 4x: "
            "best for a small mask on a big picture. *Composite* blends the result in, `feather` pixels "
            "inside the mask's edge."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_outpaint",
        title="FLUX.2 [klein] 4B: outpaint",
        summary=(
            "Extends an image beyond its borders following the prompt. *Outpaint Pad* adds the space (here "
            "256 pixels on the right; any side, multiples of 16) and the mask, fading over `feather` pixels "
            "into the original edge; the original pixels come back unchanged."
        ),
        **KLEIN_4B,
        prompt="The same scene continued to the right, seamless, same light and style.",
        width=0,
        height=0,
        mode=Mode.OUTPAINT,
        settings=f"{DISTILLED_SETTINGS}\n\nThe output is the padded canvas at its full size.",
    ),
    Recipe(
        name="flux2_klein_4b_text_to_image_4mp",
        title="FLUX.2 [klein] 4B: text to image at 4 megapixels in one pass",
        summary=(
            "Text to image at **2048 x 2048** in one pass with the distilled klein 4B model, the sampler's "
            "`position_extrapolation` on (`dype`) and a tiled decode. klein is trained to about 4 MP, so at "
            "2048 x 2048 (the default `extrapolation_base`) its positions stay native and the option changes "
            "nothing; set a side above 2048 (e.g. 2880 x 2048) and DyPE moves the image's RoPE frequencies "
            "as the noise falls, so the picture keeps one layout instead of repeating."
        ),
        **KLEIN_4B,
        prompt=FOX,
        width=2048,
        height=2048,
        position_extrapolation="dype",
        decode_tile=1024,
        settings=(
            f"{DISTILLED_SETTINGS}\n\nThe schedule shift follows the image's own token count (BFL's "
            "empirical mu: 3.23 at 2048 x 2048). A 4 MP step holds 16384 image tokens: the sampler checks "
            "the memory before it starts. *FLUX.2 Decode* decodes in 1024 px tiles (`tile_size`), so the "
            "decode stays small. To enlarge an existing picture instead, use the upscale workflow."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_upscale_2x",
        title="FLUX.2 [klein] 4B: upscale 2x with tiled refinement",
        summary=(
            "Enlarges an image 2x (native *Upscale Image By*, Lanczos; an upscale model from *Load Upscale "
            "Model* + *Upscale Image (using Model)* works in its place) and refines it with **FLUX.2 Tiled "
            "Refine**: one canvas and one noise field; at every step each 1024 px tile is denoised with its "
            "own window of the enlarged image as reference, and the tiles' velocities are blended where they "
            "overlap before the step. No seams to hide and no colour matching: every tile is steered by the "
            "image's own pixels. Load your picture in *Image to enlarge*."
        ),
        **KLEIN_4B,
        prompt="A sharp, detailed photograph, natural textures, fine detail.",
        width=0,
        height=0,
        mode=Mode.UPSCALE,
        denoise=0.35,
        decode_tile=1024,
        settings=(
            f"{DISTILLED_SETTINGS}\n\n**denoise** 0.2-0.4 adds detail and keeps the picture (0 returns it "
            "unchanged); higher values repaint more. Describe the look, not objects: the prompt reaches "
            "every tile. `tile_size` 1024 (klein's native size, a multiple of 16) and `tile_overlap` 128 (at "
            "most half a tile) set the tiles; one tile covering the image is plain img2img with the image as "
            "reference. The refined latent is decoded in 1024 px tiles."
        ),
    ),
)


# ----------------------------------------------------------------------------------------------------
# FLUX.2 [dev]: the same nodes, the dev DiT and its Mistral text encoder.

DEV_DIT, DEV_TEXT_ENCODER = "flux2-dev.safetensors", "mistral_3_small_flux2_bf16.safetensors"
DEV = dict(dit=DEV_DIT, text_encoder=DEV_TEXT_ENCODER, variant="dev", steps=50, guidance=4.0)
DEV_SETTINGS = (
    "FLUX.2 [dev]: **50 steps, guidance 4.0**. The guidance value is embedded in the model (guidance-"
    "distilled): one model pass per step, no negative prompt. 28 steps is a good trade-off (BFL). Width and "
    "height: multiples of 16, about 1–4 megapixels."
)

RECIPES += (
    Recipe(
        name="flux2_dev_text_to_image",
        title="FLUX.2 [dev]: text to image",
        summary=(
            "Text to image with **FLUX.2 [dev]**, Black Forest Labs' 32B model (FLUX.2 [dev] non-commercial "
            "licence), and its Mistral-Small-3.2-24B text encoder."
        ),
        **DEV,
        prompt=FOX,
        settings=DEV_SETTINGS,
        family=Family.DEV,
    ),
    Recipe(
        name="flux2_dev_multi_reference_edit",
        title="FLUX.2 [dev]: combine several reference images",
        summary=(
            "Combines three reference images following the prompt (refer to them as image 1, 2, 3), with "
            "FLUX.2 [dev]. The references are chained: each *Reference Encode* adds one image, with its own "
            "pixel budget (`max_megapixels`) and fit (`crop`, or `resize` to keep the whole picture). For "
            "more references (BFL recommends at most 6 for dev), copy a *Load Image* + *Reference Encode* "
            "pair and chain it; for fewer, bypass (Ctrl+B) the last pair's *Reference Encode* or delete it."
        ),
        **DEV,
        prompt=(
            "The person from image 1 wearing the jacket from image 2, standing in the street shown in image "
            "3. Natural light, photorealistic."
        ),
        references=3,
        width=0,
        height=0,
        settings=f"{DEV_SETTINGS}\n\n{EDIT_SIZE} Every extra reference makes each step slower.",
        family=Family.DEV,
    ),
    Recipe(
        name="flux2_dev_lora",
        title="FLUX.2 [dev]: text to image with a LoRA",
        summary=(
            "Text to image with **FLUX.2 [dev]** and a LoRA on top, through the **FLUX.2 LoRA Loader** "
            "(its report shown: what matched, per module). It reads dev LoRAs from every common trainer: "
            "ai-toolkit, fal's trainer, musubi-tuner / kohya, diffusers / PEFT, OneTrainer, SimpleTuner, "
            "LyCORIS LoKr and LoHa, DoRA. Put your LoRA in `models/loras` and pick it in the loader; a klein "
            "LoRA is refused by name."
        ),
        **DEV,
        prompt=FOX,
        settings=(
            f"{DEV_SETTINGS}\n\nLoRA `strength` 1.0 is the trained effect (0 turns it off, negative values "
            "invert it); `block_strengths` (advanced) scales it per block. Chain LoRA Loaders for several "
            "LoRAs. A LoRA that also trains the text encoder changes it through the loader's `text_encoder` "
            "output."
        ),
        lora="flux2-dev-lora.safetensors",
        family=Family.DEV,
    ),
    Recipe(
        name="flux2_dev_turbo",
        title="FLUX.2 [dev] Turbo: text to image in 8 steps",
        summary=(
            "Text to image with **FLUX.2 [dev]** and fal's **FLUX.2-dev-Turbo** LoRA (FLUX.2 [dev] "
            "non-commercial licence): 8 steps instead of 50, guidance 2.5, on the LoRA's own schedule, given "
            "as sigmas in *Schedule (sigmas)* (a native ManualSigmas node) wired to the sampler's `sigmas` "
            "input. `Flux_2-Turbo-LoRA_comfyui.safetensors` (the repository's comfy/ folder) and fal's "
            "`flux.2-turbo-lora.safetensors` both load."
        ),
        **{**DEV, "steps": 8, "guidance": 2.5},
        prompt=FOX,
        settings=(
            "Turbo: **8 steps, guidance 2.5**. The schedule is the model card's sigma list as the card's own "
            "code runs it: shifted by the image size's mu, here for 1024x1024 "
            "(`1.0, 0.9474, 0.8825, 0.8003, 0.6928, 0.5462, 0.3347, 0.003, 0`). With sigmas connected the "
            "sampler's `steps` is not used: the list's length sets the steps. For another size, write that "
            "size's list (see docs/flux2-dev.md, *LoRAs and the Turbo LoRA*); the card's literal list "
            "(`1.0, 0.6509, 0.4374, 0.2932, 0.1893, 0.1108, 0.0495, 0.00031, 0`) runs too."
        ),
        lora="Flux_2-Turbo-LoRA_comfyui.safetensors",
        sigmas="1.0, 0.9474, 0.8825, 0.8003, 0.6928, 0.5462, 0.3347, 0.003, 0",
        family=Family.DEV,
    ),
    Recipe(
        name="flux2_klein_4b_native_sampler",
        title="FLUX.2 [klein] 4B in native sampling nodes",
        summary=(
            "Text to image with the distilled klein 4B model loaded by this pack and sampled by ComfyUI's "
            "own nodes: **FLUX.2 to native MODEL** and **FLUX.2 to native CONDITIONING** hand the model "
            "and the prompt to Basic Guider, KSamplerSelect, Flux2Scheduler, RandomNoise and "
            "SamplerCustomAdvanced. "
            "Swap the sampler, the scheduler or the guider, or add model patches, as with any native model."
        ),
        **KLEIN_4B,
        prompt=FOX,
        settings=(
            DISTILLED_SETTINGS + " With euler and Flux2Scheduler this graph gives the FLUX.2 Sampler's image "
            "(same seed and size). Every loading option of the model loader (quantised files, GGUF, "
            "`offload: stream`, `devices`) and LoRAs from the FLUX.2 [klein] LoRA Loader carry over; native "
            "LoRA loaders (LoraLoaderModelOnly) are refused: chain our LoRA loader before the bridge."
        ),
        sampling=Sampling.NATIVE,
    ),
    Recipe(
        name="flux2_klein_4b_native_easycache",
        title="FLUX.2 [klein] 4B base in native sampling nodes, with EasyCache",
        summary=(
            "Text to image with the klein 4B **base** model loaded by this pack, sampled by native nodes "
            "(CFG Guider with an empty negative prompt) with ComfyUI's **EasyCache** on the model: steps "
            "whose input barely changes reuse the last output change instead of running the model."
        ),
        **KLEIN_4B_BASE,
        prompt=FOX,
        negative="",
        settings=(
            "Base model: **about 50 steps, CFG 4.0** with an empty negative prompt. EasyCache pays off on "
            "many-step models like this one (the distilled models' 4 steps leave nothing to skip); ComfyUI's "
            "log says how many steps it skipped. A higher `reuse_threshold` skips more and changes the image "
            "more; 0.2 is native's default. The FLUX.2 Sampler's own `step_cache` (a First-Block Cache) is "
            "the alternative inside this pack's sampler."
        ),
        sampling=Sampling.NATIVE_EASYCACHE,
    ),
)


RECIPES += (
    Recipe(
        name="flux2_dev_controlnet_pose",
        title="FLUX.2 [dev]: text to image in the pose of a control map (Fun ControlNet)",
        summary=(
            "Text to image with **FLUX.2 [dev]** steered by a pose map through the **Fun ControlNet Union** "
            "(alibaba-pai/FLUX.2-dev-Fun-Controlnet-Union, FLUX.2 [dev] non-commercial licence): the person "
            "takes the skeleton's pose, the prompt decides everything else. Load the pose map in *Control "
            "map (pose)*; a depth, canny, HED or MLSD map works the same way in the same node."
        ),
        **DEV,
        prompt=(
            "A dancer in a flowing red dress on a wooden stage, one arm raised, warm spotlight from above, "
            "dark theatre behind her, photorealistic"
        ),
        width=0,
        height=0,
        control="pose",
        settings=(
            f"{DEV_SETTINGS}\n\nWidth and height are **0**: the output takes the control map's aspect ratio "
            "at about one megapixel (multiples of 16; a small map is scaled up to 4x). Set them to a number "
            "to force a size: the map is then resized to it."
        ),
        family=Family.DEV,
    ),
    Recipe(
        name="flux2_dev_controlnet_inpaint",
        title="FLUX.2 [dev]: inpaint under a control map (Fun ControlNet)",
        summary=(
            "Repaints the masked part of an image with **FLUX.2 [dev]**, following the prompt and a control "
            "map, through the **Fun ControlNet Union**'s inpaint mode (2602 release): the control net sees "
            "the picture around the mask and the map's structure inside it. Load the image in *Image to "
            "inpaint* (right-click, *Open in MaskEditor*, paint the area to repaint) and the map (pose, "
            "depth, canny, ...) in *Control map*; every pixel outside the mask comes back unchanged."
        ),
        **DEV,
        prompt=(
            "A young man in a white shirt with a blue ribbon at the collar, one hand in his pocket, standing "
            "on a sunny seaside path, photorealistic"
        ),
        width=0,
        height=0,
        mode=Mode.INPAINT,
        control="pose",
        settings=(
            f"{DEV_SETTINGS}\n\n*Inpaint Prepare* sets the output size from the image (about 1 megapixel, "
            "multiples of 16) and keeps the latent outside the (grown) mask; the control net gets the image "
            "and its mask as they are. *Composite* puts the result back over the original, `feather` pixels "
            "inside the mask's edge. The control map must line up with the image (run the preprocessor on "
            "the image itself). Without a map, use the klein or FLUX.1 Fill inpaint workflows."
        ),
        family=Family.DEV,
    ),
)
