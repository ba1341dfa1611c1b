"""Command line: ``python -m flux2_core generate ...`` (or ``flux2-klein generate ...``): text-to-image,
reference editing, img2img, inpaint and outpaint without ComfyUI.

The parser and the entry point; the run itself is ``run`` (FLUX.2, in phases) or ``fill`` (FLUX.1 Fill).
Everything is checked before a model is loaded. The text encoder runs first, once for every prompt, and is
released before sampling, so the DiT and the text encoder never share the device. With several ``--prompt``
each gives its own output from the same seed (``OUT-1.png``, ``OUT-2.png``, ...), and the 9B-KV model's
reference K/V are computed once for all of them. With a batch, ``OUT.png`` becomes ``OUT_1.png``, ...
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..configs import VARIANTS
from ..dit.extrapolation import DEFAULT_BASE as EXTRAPOLATION_BASE
from ..errors import Flux2Error, OutOfMemory
from ..weights.hub import DEFAULT_MODEL
from ..weights.kitchen import MODES as QUANT_COMPUTE
from ..weights.kitchen import configure_for_command_line
from . import tiled as tiled_flags
from .edit import IMG2IMG_STRENGTH
from .fill import generate_fill, is_flux1_model
from .parallel import ranks_for
from .run import DTYPES, check_arguments, run_flux2

log = logging.getLogger("flux2_core")

DEFAULT_OUTPUT = "flux2-klein.png"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flux2-klein" if Path(sys.argv[0]).name == "flux2-klein" else "python -m flux2_core",
        description="FLUX.2 [klein], FLUX.2 [dev] and FLUX.1 Fill [dev] image generation",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="text-to-image, editing, img2img, inpaint and outpaint")
    where = "a .safetensors file, a folder, or a Hugging Face id (org/repo[@revision][/file])"
    gen.add_argument("--model", default=DEFAULT_MODEL, help=f"DiT: {where}; default {DEFAULT_MODEL}")
    gen.add_argument(
        "--text-encoder",
        action="append",
        default=None,
        help=f"text encoder: {where}; default: the model's repo if it has one, else the official repo that "
        "pairs with the model (klein 4B: Qwen3-4B, klein 9B: Qwen3-8B, dev: Mistral Small 3.2). FLUX.1 Fill "
        "[dev] takes two, in any order: T5-XXL and CLIP-L",
    )
    gen.add_argument(
        "--tokenizer", action="append", default=None, metavar="DIR",
        help="a tokenizer folder (HF layout) for the text encoder; FLUX.1 Fill: a T5 and a CLIP one, in any "
        "order. Default: the tokenizer folders beside the text encoder(s), else the built-in one (FLUX.2)",
    )  # fmt: skip
    gen.add_argument(
        "--vae", default=None, help=f"VAE: {where} (FLUX.2: flux2-vae, FLUX.1 Fill: ae); default: as for "
        "--text-encoder (FLUX.2)",
    )  # fmt: skip
    gen.add_argument(
        "--prompt", action="append", default=[],
        help="repeat for one output per prompt; with --region, the global prompt (may be left out)",
    )  # fmt: skip
    gen.add_argument(
        "--region", nargs=2, action="append", default=[], metavar=("PROMPT", "MASK"),
        help="a prompt for the part of the picture a mask image shows (white = the region); repeat for more",
    )  # fmt: skip
    gen.add_argument(
        "--negative", default=None, help="negative prompt for base models (default: empty prompt)"
    )
    gen.add_argument("--reference", action="append", default=[], help="reference image; repeat for more")
    gen.add_argument(
        "--reference-max-pixels", type=int, default=None, help="pixel cap per reference (1024^2)"
    )
    gen.add_argument(
        "--reference-strength", action="append", type=float, default=[], metavar="S",
        help="how much a reference counts: 1 the plain edit, 0 ignores it, above 1 follows it more; repeat "
        "in the order of --reference, or give once for all",
    )  # fmt: skip
    gen.add_argument("--image", default=None, help="image to start from (img2img), inpaint or outpaint")
    gen.add_argument("--mask", default=None, help="inpaint mask for --image: white = repaint")
    gen.add_argument(
        "--controlnet", default=None, metavar="FILE",
        help="FLUX.2 [dev] only: the Fun ControlNet Union (FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors)",
    )  # fmt: skip
    gen.add_argument("--control", default=None, metavar="IMAGE", help="with --controlnet: the control map")
    gen.add_argument(
        "--control-strength", type=float, default=0.75, metavar="S",
        help="with --controlnet: how strongly the map steers (0.65-0.80 recommended; 0: no control)",
    )  # fmt: skip
    gen.add_argument(
        "--control-mask", default=None, metavar="MASK",
        help="with --controlnet: its inpaint mode (white = regenerate), the picture to inpaint from --image",
    )  # fmt: skip
    gen.add_argument(
        "--strength",
        type=float,
        default=None,
        help=f"how much of the schedule runs from --image: 1 repaints fully (default with --mask and "
        f"--outpaint), {IMG2IMG_STRENGTH} without a mask",
    )
    gen.add_argument("--outpaint", default=None, help="LEFT,TOP,RIGHT,BOTTOM pixels to add (multiples of 16)")
    gen.add_argument("--mask-feather", type=int, default=0, help="pixels of blend inside the mask's edge")
    gen.add_argument("--no-composite", action="store_true", help="save the raw decoded inpaint, no composite")
    gen.add_argument(
        "--width",
        type=int,
        default=None,
        help="default: first reference's size, else the control map's (about 1 MP), else 1024",
    )
    gen.add_argument("--height", type=int, default=None)
    gen.add_argument("--steps", type=int, default=None, help="default: 4 distilled / kv, 50 base, dev, Fill")
    gen.add_argument(
        "--sigmas", default=None, metavar="LIST",
        help="a schedule run as given instead of the model's own, e.g. \"1.0, 0.75, 0.5, 0.25, 0\" (a final "
        "0 is added when missing; the steps are the list's; FLUX.2 models)",
    )  # fmt: skip
    gen.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="default: 1 distilled / kv, 4 base and dev, 30 FLUX.1 Fill",
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--batch-size", type=int, default=1)
    gen.add_argument(
        "--variant", default="auto", choices=["auto", *VARIANTS], help="default: read from the file"
    )
    gen.add_argument(
        "--dtype", default=None, choices=list(DTYPES), help="default: bfloat16 on GPU, float32 on CPU"
    )
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument(
        "--quant-compute",
        default="auto",
        choices=list(QUANT_COMPUTE),
        help="how quantised layers multiply: auto (in their format through comfy-kitchen where the GPU can: "
        "fp8 on compute capability 8.9+, nvfp4 / mxfp8 on 10.0+; else dequantised first), dequantize "
        "(always dequantised first), format (in format wherever a kernel exists, slow: for checking)",
    )
    gen.add_argument(
        "--offload",
        default="none",
        choices=["none", "stream"],
        help="stream: keep the DiT's blocks in CPU memory and copy each to the GPU just before it runs",
    )
    gen.add_argument(
        "--resident-mb", type=int, default=0, help="with --offload stream: MB of blocks kept on the GPU"
    )
    gen.add_argument(
        "--vae-tile",
        type=int,
        default=0,
        metavar="N",
        help="VAE tile size in pixels (a multiple of 16, at least 128); 0: tile only what does not fit",
    )
    gen.add_argument(
        "--compile", action="store_true", help="torch.compile the DiT's blocks (slow first step)"
    )
    gen.add_argument(
        "--step-cache", type=float, default=0.0, metavar="THRESHOLD",
        help="First-Block Cache: skip the blocks after the first on steps whose first block changes the "
        "image as the last full step's did (0: off, the default; try 0.05-0.2 for 50-step models)",
    )  # fmt: skip
    gen.add_argument(
        "--dype", action="store_true",
        help="position extrapolation (DyPE) for sides past --dype-base: one pass at 4 MP and beyond",
    )  # fmt: skip
    gen.add_argument(
        "--dype-base", type=int, default=EXTRAPOLATION_BASE, metavar="PX",
        help=f"with --dype: pixels per side the model handles natively (default {EXTRAPOLATION_BASE})",
    )  # fmt: skip
    tiled_flags.add_flags(gen)
    gen.add_argument(
        "--parallel", default=None, choices=["tensor", "sequence"],
        help="under torchrun --nproc-per-node N: run the DiT across the N processes (one per GPU; --device "
        "cpu uses gloo): tensor splits the weights (about 1/N each), sequence the tokens; rank 0 writes",
    )  # fmt: skip
    gen.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[:STRENGTH]",
        help="a LoRA .safetensors (any common trainer's layout), strength default 1; repeat for more",
    )
    gen.add_argument(
        "--output", default=DEFAULT_OUTPUT, help=f"image file, .png/.jpg/.webp (default {DEFAULT_OUTPUT})"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    configure_for_command_line()
    try:
        for path in generate(args):
            log.info("saved %s", path)
    except Flux2Error as e:
        log.error("error: %s", e)
        return 2
    except OutOfMemory:
        log.error(
            "error: out of memory: lower --width/--height, --batch-size or the number of references, or use "
            "--dtype bfloat16"
        )
        return 2
    except KeyboardInterrupt:
        log.error("interrupted: no image was written")
        return 130
    return 0


def generate(args: argparse.Namespace) -> list[Path]:
    """Run ``generate`` with parsed ``args``; returns the files written (none on the other ranks)."""
    fill = is_flux1_model(args.model)  # FLUX.1 Fill [dev]: its own run after the common checks
    with ranks_for(args, fill) as ranks:  # a process that stops tells the others, then leaves the group
        request = check_arguments(args, fill, ranks)
        return generate_fill(request) if fill else run_flux2(request, ranks)


if __name__ == "__main__":
    sys.exit(main())
