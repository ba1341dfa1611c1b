"""Where the files the pack runs come from: repo, licence, size, ComfyUI folder and a direct link.

One table for the loaders (an empty folder names the file to get and its link), the bundled workflows
(their per-node ``models`` download entries, which ComfyUI's frontend offers when a file is missing) and
the README. Links are those of ComfyUI's official klein, FLUX.2 [dev] and FLUX.1 Fill templates or the BFL
repos (klein 9B-KV's follows the naming of BFL's other klein repos, as the official fp8 template's
does); every file has a link, as the frontend's workflow schema requires. Sizes: klein's and
dev's from the parameter counts (fp8: one byte per weight), FLUX.1's as published (bf16 DiT, fp16 T5, fp32
VAE). Nothing in the pack downloads by itself. Imports nothing, so scripts can read it without ComfyUI.
"""

from __future__ import annotations

from dataclasses import dataclass

HF = "https://huggingface.co"


@dataclass(frozen=True)
class ModelFile:
    name: str
    folder: str  # ComfyUI models sub-folder
    url: str  # direct download link (https)
    repo: str  # "org/name" on the Hugging Face Hub
    licence: str
    size_gb: float
    what: str
    also: tuple[str, ...] = ()  # other repos that ship the same file (the official BFL repo, say)

    @property
    def repo_url(self) -> str:
        return f"{HF}/{self.repo}"

    @property
    def source(self) -> str:
        """Markdown: the repo links and the licence."""
        return f"{self.repos_markdown} ({self.licence})"

    @property
    def repos_markdown(self) -> str:
        return ", ".join(f"[{repo}]({HF}/{repo})" for repo in (self.repo, *self.also))


def _comfy(repo: str, folder: str, name: str) -> str:
    return f"{HF}/{repo}/resolve/main/split_files/{folder}/{name}"


APACHE, FLUX_NC = "Apache-2.0", "FLUX non-commercial licence"
DEV_NC = "FLUX.2 [dev] non-commercial licence"
FILES = {
    f.name: f
    for f in (
        ModelFile("flux-2-klein-4b.safetensors", "diffusion_models",
                  _comfy("Comfy-Org/flux2-klein", "diffusion_models", "flux-2-klein-4b.safetensors"),
                  "Comfy-Org/flux2-klein", APACHE, 7.75, "klein 4B, distilled",
                  also=("black-forest-labs/FLUX.2-klein-4B",)),
        ModelFile("flux-2-klein-base-4b.safetensors", "diffusion_models",
                  _comfy("Comfy-Org/flux2-klein", "diffusion_models", "flux-2-klein-base-4b.safetensors"),
                  "Comfy-Org/flux2-klein", APACHE, 7.75, "klein 4B base",
                  also=("black-forest-labs/FLUX.2-klein-base-4B",)),
        ModelFile("flux-2-klein-9b.safetensors", "diffusion_models",
                  f"{HF}/black-forest-labs/FLUX.2-klein-9B/resolve/main/flux-2-klein-9b.safetensors",
                  "black-forest-labs/FLUX.2-klein-9B", FLUX_NC, 18.2, "klein 9B, distilled (gated)"),
        ModelFile("flux-2-klein-base-9b.safetensors", "diffusion_models",
                  f"{HF}/black-forest-labs/FLUX.2-klein-base-9B/resolve/main/flux-2-klein-base-9b.safetensors",
                  "black-forest-labs/FLUX.2-klein-base-9B", FLUX_NC, 18.2, "klein 9B base"),
        ModelFile("flux-2-klein-9b-kv.safetensors", "diffusion_models",
                  f"{HF}/black-forest-labs/FLUX.2-klein-9b-kv/resolve/main/flux-2-klein-9b-kv.safetensors",
                  "black-forest-labs/FLUX.2-klein-9b-kv", FLUX_NC, 18.2, "klein 9B-KV (gated)"),
        ModelFile("qwen_3_4b.safetensors", "text_encoders",
                  _comfy("Comfy-Org/flux2-klein", "text_encoders", "qwen_3_4b.safetensors"),
                  "Comfy-Org/flux2-klein", APACHE, 8.0, "Qwen3-4B, for every 4B model"),
        ModelFile("qwen_3_8b.safetensors", "text_encoders",
                  _comfy("Comfy-Org/vae-text-encorder-for-flux-klein-9b", "text_encoders",
                         "qwen_3_8b.safetensors"),
                  "Comfy-Org/vae-text-encorder-for-flux-klein-9b", APACHE, 16.4,
                  "Qwen3-8B, for every 9B model (or the folder of Qwen/Qwen3-8B in models/text_encoders: "
                  "pick any of its shards)", also=("Qwen/Qwen3-8B",)),
        ModelFile("flux2-vae.safetensors", "vae",
                  _comfy("Comfy-Org/flux2-dev", "vae", "flux2-vae.safetensors"),
                  "Comfy-Org/flux2-dev", APACHE, 0.17, "the FLUX.2 VAE, for every model"),
        # FLUX.2 [dev]: BFL's bf16 DiT (gated), Comfy-Org's fp8mixed DiT and Comfy-Org's Mistral text encoder
        # cut to the 30 layers dev reads (ComfyUI takes the Tekken tokenizer from the file itself). Sizes from
        # the parameter counts: 32.2 B DiT parameters, 17.3 B in the embedding and
        # layers 0-29.
        ModelFile("flux2-dev.safetensors", "diffusion_models",
                  f"{HF}/black-forest-labs/FLUX.2-dev/resolve/main/flux2-dev.safetensors",
                  "black-forest-labs/FLUX.2-dev", DEV_NC, 64.45, "FLUX.2 [dev], 32B, bf16 (gated)"),
        ModelFile("flux2_dev_fp8mixed.safetensors", "diffusion_models",
                  _comfy("Comfy-Org/flux2-dev", "diffusion_models", "flux2_dev_fp8mixed.safetensors"),
                  "Comfy-Org/flux2-dev", DEV_NC, 32.2,
                  "FLUX.2 [dev] in fp8 (a few layers kept in bf16): fits one 48 GB card"),
        ModelFile("mistral_3_small_flux2_bf16.safetensors", "text_encoders",
                  _comfy("Comfy-Org/flux2-dev", "text_encoders", "mistral_3_small_flux2_bf16.safetensors"),
                  "Comfy-Org/flux2-dev", APACHE, 34.7,
                  "Mistral-Small-3.2-24B, the text encoder of FLUX.2 [dev] (the 30 layers it reads)"),
        ModelFile("mistral_3_small_flux2_fp8.safetensors", "text_encoders",
                  _comfy("Comfy-Org/flux2-dev", "text_encoders", "mistral_3_small_flux2_fp8.safetensors"),
                  "Comfy-Org/flux2-dev", APACHE, 17.3, "the same Mistral text encoder in fp8"),
        # The FLUX.2 [dev] Fun ControlNet Union (VideoX-Fun's release): 4.12 B parameters in bf16.
        ModelFile("FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors", "controlnet",
                  f"{HF}/alibaba-pai/FLUX.2-dev-Fun-Controlnet-Union/resolve/main/"
                  "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors",
                  "alibaba-pai/FLUX.2-dev-Fun-Controlnet-Union", DEV_NC, 8.23,
                  "the FLUX.2 [dev] Fun ControlNet Union: pose, depth, canny, HED, MLSD, scribble, gray, "
                  "inpaint"),
        # fal's FLUX.2-dev-Turbo LoRA (8 steps), its ComfyUI conversion in the repo's comfy/ folder; the size
        # is a third-party manifest's 2,760,814,880 bytes (not checked here). fal's diffusers file,
        # flux.2-turbo-lora.safetensors at the repo's root, loads in the LoRA Loader too.
        ModelFile("Flux_2-Turbo-LoRA_comfyui.safetensors", "loras",
                  f"{HF}/fal/FLUX.2-dev-Turbo/resolve/main/comfy/Flux_2-Turbo-LoRA_comfyui.safetensors",
                  "fal/FLUX.2-dev-Turbo", DEV_NC, 2.76,
                  "fal's FLUX.2 [dev] Turbo LoRA: 8 steps instead of 50, guidance 2.5, its own sigma list"),
        # The RefControl depth LoRA for klein 4B base (thedeoxen's): 92,426,784 bytes as published.
        ModelFile("flux2_klein_4b_refcontrol_depth.safetensors", "loras",
                  f"{HF}/thedeoxen/refcontrol-FLUX.2-klein-4B-reference-depth-lora/resolve/main/"
                  "flux2_klein_4b_refcontrol_depth.safetensors",
                  "thedeoxen/refcontrol-FLUX.2-klein-4B-reference-depth-lora", APACHE, 0.09,
                  "the RefControl depth LoRA for klein 4B base: a depth map (reference 1) sets the layout of "
                  "the subject (reference 2); trigger word `refcontrol`"),
        # FLUX.1 Fill [dev]: the links of ComfyUI's official Fill templates.
        ModelFile("flux1-fill-dev.safetensors", "diffusion_models",
                  _comfy("Comfy-Org/flux1-dev", "diffusion_models", "flux1-fill-dev.safetensors"),
                  "Comfy-Org/flux1-dev", FLUX_NC, 23.8, "FLUX.1 Fill [dev], inpainting and outpainting",
                  also=("black-forest-labs/FLUX.1-Fill-dev",)),
        ModelFile("t5xxl_fp16.safetensors", "text_encoders",
                  f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/t5xxl_fp16.safetensors",
                  "comfyanonymous/flux_text_encoders", APACHE, 9.8, "T5-XXL, for FLUX.1 Fill [dev]"),
        ModelFile("clip_l.safetensors", "text_encoders",
                  f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/clip_l.safetensors",
                  "comfyanonymous/flux_text_encoders", "MIT", 0.25, "CLIP-L, for FLUX.1 Fill [dev]"),
        ModelFile("ae.safetensors", "vae",
                  _comfy("Comfy-Org/Lumina_Image_2.0_Repackaged", "vae", "ae.safetensors"),
                  "Comfy-Org/Lumina_Image_2.0_Repackaged", APACHE, 0.34,
                  "the FLUX.1 VAE (16 latent channels), for FLUX.1 Fill [dev]",
                  also=("black-forest-labs/FLUX.1-schnell",)),
    )
}  # fmt: skip

# The file a newcomer gets first for each folder the loaders read.
FIRST_FILE = {
    "diffusion_models": "flux-2-klein-4b.safetensors",
    "text_encoders": "qwen_3_4b.safetensors",
    "vae": "flux2-vae.safetensors",
}


def empty_folder_entry(folder: str, first: str | None = None) -> str:
    """What a loader's list shows when its folder holds no file: the list is never empty. ``first``: the
    file this loader wants (default: the klein file of ``FIRST_FILE``)."""
    first = first or FIRST_FILE.get(folder)
    if first is None:  # loras: nothing to download by default
        return f"(models/{folder} is empty)"
    return f"(models/{folder} is empty: get {first})"


def empty_folder_message(folder: str, first: str | None = None) -> str:
    first = first or FIRST_FILE.get(folder)
    if first is None:
        return (
            f"ComfyUI's models/{folder} folder holds no file: put a FLUX.2 LoRA (.safetensors) made "
            f"for this model into ComfyUI/models/{folder}/, then press R in the editor to refresh lists"
        )
    f = FILES[first]
    return (
        f"ComfyUI's models/{folder} folder holds no model file: download {f.name} ({f.what}, "
        f"{f.size_gb:g} GB) from {f.url} into ComfyUI/models/{folder}/, then press R in the editor to "
        "refresh the lists"
    )
