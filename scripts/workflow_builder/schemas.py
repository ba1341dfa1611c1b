"""Node schemas: what the graph editor needs to know about each node type a workflow uses.

The pack's own nodes are read from their classes (the V1 view ComfyUI derives from each V3 schema:
``INPUT_TYPES``, ``RETURN_TYPES``, ``RETURN_NAMES``, and the schema's display name), registered the way
ComfyUI registers the folder, under the test suite's fake host (``tests/fixtures/comfy_stubs.py``), so the
workflows can never drift from the nodes. The few native ComfyUI nodes the
workflows use are written below; the integration tests check them against a real server's ``/object_info``.
Link inputs and widgets are listed in ``INPUT_TYPES`` order (required first, then optional).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}  # with a list of choices (COMBO): what the editor draws
PACK_MODULE = "flux2_klein_workflow_schemas"  # the name the pack is imported under here


@dataclass(frozen=True)
class Socket:
    name: str
    type: str
    optional: bool = False


@dataclass(frozen=True)
class Widget:
    name: str
    type: str  # INT / FLOAT / STRING / BOOLEAN / COMBO / IMAGEUPLOAD (as the frontend names widget inputs)
    optional: bool = False
    control_after_generate: bool = False  # the frontend adds a "randomize"/"fixed" value after it
    in_api: bool = True  # False for frontend-only widgets (LoadImage's upload button)
    label: str | None = None  # the frontend's localized_name, when it is not the name
    multiline: bool = False  # a STRING drawn as a text box of its own (no label, nothing cut)


@dataclass(frozen=True)
class NodeSpec:
    display_name: str
    inputs: tuple[Socket, ...] = ()
    widgets: tuple[Widget, ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()  # (name, type)
    frontend_only: bool = False  # notes: never sent to the server


def spec_of(node_class, display_name: str) -> NodeSpec:
    """A node class's schema, from what ComfyUI reads of it."""
    declared = node_class.INPUT_TYPES()
    sockets, widgets = [], []
    for section in ("required", "optional"):
        for name, (kind, *rest) in declared.get(section, {}).items():
            options = rest[0] if rest else {}
            optional = section == "optional"
            combo = kind == "COMBO" or isinstance(kind, (list, tuple))  # V3 combos / V1 lists of choices
            if combo or kind in WIDGET_TYPES:
                widget_type = "COMBO" if combo else kind
                control = bool(options.get("control_after_generate"))
                multiline = bool(options.get("multiline"))
                widgets.append(Widget(name, widget_type, optional, control, multiline=multiline))
            else:
                sockets.append(Socket(name, kind, optional))
    names = getattr(node_class, "RETURN_NAMES", None) or node_class.RETURN_TYPES
    outputs = tuple(zip(names, node_class.RETURN_TYPES))
    return NodeSpec(display_name, tuple(sockets), tuple(widgets), outputs)


@dataclass(frozen=True)
class InputDoc:
    name: str
    type: str  # a socket type, a widget type, or COMBO
    optional: bool
    advanced: bool
    default: object
    tooltip: str
    options: tuple = ()  # a combo's choices
    control_after_generate: bool = False  # an INT the editor follows with a randomize / fixed value


@dataclass(frozen=True)
class NodeDoc:
    """What a node's help page says of it, read from the node class (its V1 view, as /object_info serves)."""

    node_id: str
    display_name: str
    category: str
    description: str
    inputs: tuple[InputDoc, ...]
    outputs: tuple[tuple[str, str, str], ...]  # (name, type, tooltip)


def doc_of(node_id: str, node_class, display_name: str) -> NodeDoc:
    declared = node_class.INPUT_TYPES()
    inputs = []
    for section in ("required", "optional"):
        for name, (kind, *rest) in declared.get(section, {}).items():
            options = rest[0] if rest else {}
            combo = kind == "COMBO" or isinstance(kind, (list, tuple))
            choices = tuple(options.get("options", kind if isinstance(kind, (list, tuple)) else ()))
            inputs.append(InputDoc(name, "COMBO" if combo else kind, section == "optional",
                                   bool(options.get("advanced")), options.get("default"),
                                   options.get("tooltip") or "", choices,
                                   bool(options.get("control_after_generate"))))  # fmt: skip
    names = getattr(node_class, "RETURN_NAMES", None) or node_class.RETURN_TYPES
    tooltips = getattr(node_class, "OUTPUT_TOOLTIPS", None) or [None] * len(names)
    outputs = tuple((n, t, tip or "") for n, t, tip in zip(names, node_class.RETURN_TYPES, tooltips))
    description = node_class.DESCRIPTION or ""
    return NodeDoc(node_id, display_name, node_class.CATEGORY, description, tuple(inputs), outputs)


def load_pack():
    """(node specs, model-file table, node docs in registration order) of the pack, imported under the fake
    host and removed again."""
    sys.path.insert(0, str(REPO / "tests" / "fixtures"))  # the fake host; for this import only
    try:
        from comfy_stubs import FakeHost, pack_nodes
    finally:
        sys.path.remove(str(REPO / "tests" / "fixtures"))
    with tempfile.TemporaryDirectory() as models, FakeHost(Path(models)).installed():
        spec = importlib.util.spec_from_file_location(
            PACK_MODULE, REPO / "__init__.py", submodule_search_locations=[str(REPO)]
        )
        pack = importlib.util.module_from_spec(spec)
        sys.modules[PACK_MODULE] = pack
        try:
            spec.loader.exec_module(pack)
            registered = pack_nodes(pack)
            specs = {
                node_id: spec_of(cls, registered.display_names[node_id])
                for node_id, cls in registered.classes.items()
            }
            files = sys.modules[f"{PACK_MODULE}.nodes.model_files"].FILES
            docs = {
                node_id: doc_of(node_id, cls, registered.display_names[node_id])
                for node_id, cls in registered.classes.items()
            }
        finally:
            for name in [m for m in sys.modules if m == PACK_MODULE or m.startswith(PACK_MODULE + ".")]:
                del sys.modules[name]
    return specs, files, docs


NATIVE_SPECS: dict[str, NodeSpec] = {
    "PreviewAny": NodeSpec("Preview Any", inputs=(Socket("source", "*"),), outputs=(("STRING", "STRING"),)),
    "LoadImage": NodeSpec(
        "Load Image",
        widgets=(
            Widget("image", "COMBO"),
            Widget("upload", "IMAGEUPLOAD", in_api=False, label="choose file to upload"),
        ),
        outputs=(("IMAGE", "IMAGE"), ("MASK", "MASK")),
    ),
    "SaveImage": NodeSpec(
        "Save Image",
        inputs=(Socket("images", "IMAGE"),),
        widgets=(Widget("filename_prefix", "STRING"),),
        outputs=(("images", "IMAGE"),),
    ),
    "MarkdownNote": NodeSpec(
        "Markdown Note", widgets=(Widget("text", "STRING", multiline=True),), frontend_only=True
    ),
    # masks (the regional-prompt workflow)
    "SolidMask": NodeSpec(
        "Create Solid Mask",
        widgets=(Widget("value", "FLOAT"), Widget("width", "INT"), Widget("height", "INT")),
        outputs=(("MASK", "MASK"),),
    ),
    "MaskComposite": NodeSpec(
        "Combine Masks",
        inputs=(Socket("destination", "MASK"), Socket("source", "MASK")),
        widgets=(Widget("x", "INT"), Widget("y", "INT"), Widget("operation", "COMBO")),
        outputs=(("MASK", "MASK"),),
    ),
    "InvertMask": NodeSpec("Invert Mask", inputs=(Socket("mask", "MASK"),), outputs=(("MASK", "MASK"),)),
    # enlarging an image (the upscale workflow)
    "ImageScaleBy": NodeSpec(
        "Upscale Image By",
        inputs=(Socket("image", "IMAGE"),),
        widgets=(Widget("upscale_method", "COMBO"), Widget("scale_by", "FLOAT")),
        outputs=(("IMAGE", "IMAGE"),),
    ),
    # native sampling (the native-sampler workflows)
    "BasicGuider": NodeSpec(
        "Basic Guider",
        inputs=(Socket("model", "MODEL"), Socket("conditioning", "CONDITIONING")),
        outputs=(("GUIDER", "GUIDER"),),
    ),
    "CFGGuider": NodeSpec(
        "CFG Guider",
        inputs=(Socket("model", "MODEL"), Socket("positive", "CONDITIONING"),
                Socket("negative", "CONDITIONING")),
        widgets=(Widget("cfg", "FLOAT"),),
        outputs=(("GUIDER", "GUIDER"),),
    ),
    "RandomNoise": NodeSpec(
        "RandomNoise",
        widgets=(Widget("noise_seed", "INT", control_after_generate=True),),
        outputs=(("NOISE", "NOISE"),),
    ),
    "KSamplerSelect": NodeSpec(
        "KSamplerSelect", widgets=(Widget("sampler_name", "COMBO"),), outputs=(("SAMPLER", "SAMPLER"),)
    ),
    "ManualSigmas": NodeSpec(
        "ManualSigmas", widgets=(Widget("sigmas", "STRING"),), outputs=(("SIGMAS", "SIGMAS"),)
    ),
    "Flux2Scheduler": NodeSpec(
        "Flux2Scheduler",
        widgets=(Widget("steps", "INT"), Widget("width", "INT"), Widget("height", "INT")),
        outputs=(("SIGMAS", "SIGMAS"),),
    ),
    "EmptyFlux2LatentImage": NodeSpec(
        "Empty Flux 2 Latent",
        widgets=(Widget("width", "INT"), Widget("height", "INT"), Widget("batch_size", "INT")),
        outputs=(("LATENT", "LATENT"),),
    ),
    "SamplerCustomAdvanced": NodeSpec(
        "SamplerCustomAdvanced",
        inputs=(Socket("noise", "NOISE"), Socket("guider", "GUIDER"), Socket("sampler", "SAMPLER"),
                Socket("sigmas", "SIGMAS"), Socket("latent_image", "LATENT")),
        outputs=(("output", "LATENT"), ("denoised_output", "LATENT")),
    ),
    "EasyCache": NodeSpec(
        "EasyCache",
        inputs=(Socket("model", "MODEL"),),
        widgets=(Widget("reuse_threshold", "FLOAT"), Widget("start_percent", "FLOAT"),
                 Widget("end_percent", "FLOAT"), Widget("verbose", "BOOLEAN")),
        outputs=(("MODEL", "MODEL"),),
    ),
}  # fmt: skip

PACK_SPECS, FILES, NODE_DOCS = load_pack()
NODE_SPECS: dict[str, NodeSpec] = {**PACK_SPECS, **NATIVE_SPECS}
