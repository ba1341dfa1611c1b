"""The pack's node contract, written once: node ids, display names, categories, inputs (in order, required
then optional, each with its type) and output types.

Saved workflows and API clients store the ids and the input names, so they never change; the README's
"Nodes" table documents them. The node classes are checked against this table on the fake host
(test_nodes.py, test_nodes_fill.py: the V1 view ComfyUI derives from each V3 schema) and in a real
ComfyUI's ``/object_info`` (integration/test_server.py); the workflow tests read the bundled workflows
against it (test_workflows.py). The workflow generator reads the node classes themselves,
so a change there that this table does not follow fails here, not in a user's graph.
Input types: a socket type (``MODEL`` below, ``IMAGE``, ``LATENT``, ...), a widget type (``INT``, ``FLOAT``,
``STRING``, ``BOOLEAN``) or ``COMBO`` (a list of choices: ``("COMBO", {"options": [...]})`` in V3).
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL, TE, VAE = "FLUX2_KLEIN_MODEL", "FLUX2_KLEIN_TEXT_ENCODER", "FLUX2_KLEIN_VAE"
COND, REFS, STITCH = "FLUX2_KLEIN_CONDITIONING", "FLUX2_KLEIN_REFERENCES", "FLUX2_KLEIN_STITCH"
FILL_MODEL, FILL_TE, FILL_VAE = "FLUX1_FILL_MODEL", "FLUX1_FILL_TEXT_ENCODER", "FLUX1_FILL_VAE"
FILL_COND = "FLUX1_FILL_CONDITIONING"
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")


@dataclass(frozen=True)
class Node:
    display: str
    category: str
    required: tuple[tuple[str, str], ...]  # (input name, type), in order
    optional: tuple[tuple[str, str], ...]
    outputs: tuple[str, ...]
    control_after_generate: tuple[str, ...] = ()  # INT widgets the editor follows with randomize / fixed

    @property
    def required_names(self) -> list[str]:
        return [name for name, _ in self.required]

    @property
    def optional_names(self) -> list[str]:
        return [name for name, _ in self.optional]

    @property
    def sockets(self) -> dict[str, tuple[str, bool]]:
        """Link inputs: name -> (type, required)."""
        return {
            name: (kind, section is self.required)
            for section in (self.required, self.optional)
            for name, kind in section
            if kind not in WIDGET_TYPES
        }

    @property
    def widgets(self) -> list[str]:
        """Widget inputs in the order the editor lists them (required first, then optional)."""
        return [name for name, kind in (*self.required, *self.optional) if kind in WIDGET_TYPES]


def kind_of(spec: tuple | list) -> str:
    """The contract's type of one ``INPUT_TYPES`` / ``/object_info`` entry: V3 combos are
    ``("COMBO", {"options": [...]})``, V1 ones a list of choices."""
    return "COMBO" if isinstance(spec[0], (list, tuple)) else spec[0]


def choices(spec: tuple | list) -> list:
    """The choices of a combo input's ``INPUT_TYPES`` / ``/object_info`` entry (V3 or V1 form)."""
    return list(spec[0]) if isinstance(spec[0], (list, tuple)) else list(spec[1]["options"])


LOADERS, CONDITIONING, SAMPLING, LATENT, INPAINT = (
    f"flux2_klein/{c}" for c in ("loaders", "conditioning", "sampling", "latent", "inpaint")
)
NATIVE = "flux2_klein/native"
TILES = (("tile_size", "INT"), ("tile_overlap", "INT"))

CONTRACT: dict[str, Node] = {
    "Flux2KleinModelLoader": Node(
        "FLUX.2 Model Loader", LOADERS,
        (("model_name", "COMBO"), ("variant", "COMBO")),
        (("weight_dtype", "COMBO"), ("offload", "COMBO"), ("resident_mb", "INT"), ("devices", "STRING")),
        (MODEL,),
    ),
    "Flux2KleinTextEncoderLoader": Node(
        "FLUX.2 Text Encoder Loader", LOADERS,
        (("text_encoder_name", "COMBO"),), (("device", "COMBO"),), (TE,),
    ),
    "Flux2KleinVAELoader": Node("FLUX.2 VAE Loader", LOADERS, (("vae_name", "COMBO"),), (), (VAE,)),
    "Flux2KleinTextEncode": Node(
        "FLUX.2 Text Encode", CONDITIONING, (("text_encoder", TE), ("text", "STRING")), (), (COND,)
    ),
    "Flux2KleinReferenceEncode": Node(
        "FLUX.2 Reference Encode", CONDITIONING,
        (("vae", VAE), ("image", "IMAGE")),
        (("references", REFS), ("max_megapixels", "FLOAT"), ("resize", "COMBO"), *TILES),
        (REFS,),
    ),
    "Flux2KleinSampler": Node(
        "FLUX.2 Sampler", SAMPLING,
        (("model", MODEL), ("positive", COND), ("seed", "INT"), ("steps", "INT"), ("guidance", "FLOAT"),
         ("width", "INT"), ("height", "INT"), ("batch_size", "INT")),
        (("negative", COND), ("references", REFS), ("latent", "LATENT"), ("denoise", "FLOAT"),
         ("kv_cache", "COMBO"), ("step_cache", "FLOAT")),
        ("LATENT",),
        control_after_generate=("seed",),
    ),
    "Flux2KleinDecode": Node(
        "FLUX.2 Decode", LATENT, (("vae", VAE), ("latent", "LATENT")), TILES, ("IMAGE",)
    ),
    "Flux2KleinEncode": Node("FLUX.2 Encode", LATENT, (("vae", VAE), ("image", "IMAGE")), (), ("LATENT",)),
    "Flux2KleinInpaintPrepare": Node(
        "FLUX.2 Inpaint Prepare", INPAINT,
        (("vae", VAE), ("image", "IMAGE"), ("mask", "MASK")),
        (("references", REFS), ("grow_mask", "INT"), ("crop_to_mask", "BOOLEAN"), ("context", "INT")),
        ("LATENT", REFS, STITCH),
    ),
    "Flux2KleinComposite": Node(
        "FLUX.2 Composite", INPAINT,
        (("image", "IMAGE"), ("stitch", STITCH), ("feather", "INT")), (), ("IMAGE",),
    ),
    "Flux2KleinOutpaintPad": Node(
        "FLUX.2 Outpaint Pad", INPAINT,
        (("image", "IMAGE"), *((side, "INT") for side in ("left", "top", "right", "bottom", "feather"))),
        (),
        ("IMAGE", "MASK"),
    ),
    "Flux2KleinLoraLoader": Node(
        "FLUX.2 [klein] LoRA Loader", LOADERS,
        (("model", MODEL), ("lora_name", "COMBO"), ("strength", "FLOAT")),
        (("block_strengths", "STRING"), ("text_encoder", TE)),
        (MODEL, "STRING", TE),
    ),
    "Flux2KleinToNativeModel": Node(
        "FLUX.2 to native MODEL", NATIVE, (("model", MODEL),), (), ("MODEL",)
    ),
    "Flux2KleinToNativeConditioning": Node(
        "FLUX.2 to native CONDITIONING", NATIVE, (("conditioning", COND),), (), ("CONDITIONING",)
    ),
    "Flux2KleinFromNativeConditioning": Node(
        "FLUX.2 from native CONDITIONING", NATIVE, (("conditioning", "CONDITIONING"),), (), (COND,)
    ),
    "Flux1FillModelLoader": Node(
        "FLUX.1 Fill [dev] Model Loader", "flux1_fill/loaders",
        (("model_name", "COMBO"),), (("weight_dtype", "COMBO"),), (FILL_MODEL,),
    ),
    "Flux1FillTextEncoderLoader": Node(
        "FLUX.1 Fill [dev] Text Encoder Loader", "flux1_fill/loaders",
        (("t5_name", "COMBO"), ("clip_name", "COMBO")), (("device", "COMBO"),), (FILL_TE,),
    ),
    "Flux1FillVAELoader": Node(
        "FLUX.1 Fill [dev] VAE Loader", "flux1_fill/loaders", (("vae_name", "COMBO"),), (), (FILL_VAE,)
    ),
    "Flux1FillTextEncode": Node(
        "FLUX.1 Fill [dev] Text Encode", "flux1_fill/conditioning",
        (("text_encoder", FILL_TE), ("text", "STRING")), (), (FILL_COND,),
    ),
    "Flux1FillSampler": Node(
        "FLUX.1 Fill [dev] Sampler", "flux1_fill/sampling",
        (("model", FILL_MODEL), ("positive", FILL_COND), ("vae", FILL_VAE), ("image", "IMAGE"),
         ("mask", "MASK"), ("seed", "INT"), ("steps", "INT"), ("guidance", "FLOAT")),
        (("denoise", "FLOAT"), ("grow_mask", "INT"), ("crop_to_mask", "BOOLEAN"), ("context", "INT"),
         ("batch_size", "INT"), ("step_cache", "FLOAT")),
        ("LATENT", STITCH),
        control_after_generate=("seed",),
    ),
    "Flux1FillDecode": Node(
        "FLUX.1 Fill [dev] Decode", "flux1_fill/latent",
        (("vae", FILL_VAE), ("latent", "LATENT")), TILES, ("IMAGE",),
    ),
}  # fmt: skip

KLEIN_NODES = {k: v for k, v in CONTRACT.items() if k.startswith("Flux2Klein")}
FILL_NODES = {k: v for k, v in CONTRACT.items() if k.startswith("Flux1Fill")}


def contract_mismatches(node_id: str, node_class, display: str) -> list[str]:
    """How a node class differs from its contract (empty when it follows it)."""
    want, found = CONTRACT[node_id], []
    declared = node_class.INPUT_TYPES()
    for section, expected in (("required", want.required), ("optional", want.optional)):
        got = tuple((name, kind_of(spec)) for name, spec in declared.get(section, {}).items())
        if got != expected:
            found.append(f"{section} inputs {got} != {expected}")
    controls = tuple(
        name
        for section in ("required", "optional")
        for name, spec in declared.get(section, {}).items()
        if len(spec) > 1 and spec[1].get("control_after_generate")
    )
    if controls != want.control_after_generate:
        found.append(f"control_after_generate {controls} != {want.control_after_generate}")
    if tuple(node_class.RETURN_TYPES) != want.outputs:
        found.append(f"outputs {tuple(node_class.RETURN_TYPES)} != {want.outputs}")
    if display != want.display:
        found.append(f"display name {display!r} != {want.display!r}")
    if node_class.CATEGORY != want.category:
        found.append(f"category {node_class.CATEGORY!r} != {want.category!r}")
    return found
