"""A fake of ComfyUI's V3 node API (``comfy_api.latest``: ``io`` and ``ComfyExtension``), for the CPU tests.

It holds what the pack's nodes use, with the real API's behaviour (ComfyUI 0.29,
``comfy_api/latest/_io.py``): a schema of typed inputs and outputs, the V1 view ComfyUI derives from it
(``INPUT_TYPES`` / ``RETURN_TYPES`` / ``CATEGORY`` ..., what ``/object_info`` serves: each input's options
with the ``None`` ones pruned, a combo as ``("COMBO", {"options": [...]})``), ``NodeOutput`` and the
extension whose async ``get_node_list`` ComfyUI awaits when it loads a pack. The integration tests hold the
real server's ``/object_info`` against the same contract (integration/test_server.py), so a difference
between this fake and the real API shows there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


def _prune(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


class _Input:
    io_type = ""

    def __init__(self, id: str, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                 extra_dict=None, **options):  # fmt: skip
        self.id, self.display_name, self.optional, self.tooltip = id, display_name, optional, tooltip
        self.lazy, self.default, self.extra_dict = lazy, default, extra_dict or {}
        self.options = options

    def as_dict(self) -> dict:
        return (
            _prune(
                {
                    "display_name": self.display_name,
                    "tooltip": self.tooltip,
                    "lazy": self.lazy,
                    "default": self.default,
                }  # fmt: skip
            )
            | _prune(self.widget_options())
            | _prune(self.extra_dict)
        )

    def widget_options(self) -> dict:
        return {}


class _Output:
    io_type = ""

    def __init__(self, id: str | None = None, display_name: str | None = None, tooltip: str | None = None,
                 is_output_list: bool = False):  # fmt: skip
        self.id, self.display_name, self.tooltip, self.is_output_list = (
            id,
            display_name,
            tooltip,
            is_output_list,
        )


def _comfy_type(io_type: str, input_options: tuple[tuple[str, str], ...] = ()) -> type:
    """A ComfyType: a class with nested ``Input`` / ``Output``; ``input_options``: (keyword, V1 key) of a
    widget's own options, in the order the real ``as_dict`` writes them."""

    class Input(_Input):
        def __init__(self, id: str, *args, **kwargs):
            own = {key: kwargs.pop(key, None) for key, _ in input_options}
            if args:  # Combo.Input(id, options, ...)
                own["options"] = args[0]
            super().__init__(id, **kwargs)
            self.own = own

        def widget_options(self) -> dict:
            values = {v1: self.own.get(key) for key, v1 in input_options}
            if io_type == "COMBO":
                values["multiselect"] = False
            return values

    Input.io_type = io_type

    class Output(_Output):
        pass

    Output.io_type = io_type
    return type(io_type, (), {"io_type": io_type, "Input": Input, "Output": Output})


NUMBER = (("min", "min"), ("max", "max"), ("step", "step"))
Int = _comfy_type(
    "INT", (*NUMBER, ("control_after_generate", "control_after_generate"), ("display_mode", "display"))
)
Float = _comfy_type("FLOAT", (*NUMBER, ("round", "round"), ("display_mode", "display")))
String = _comfy_type(
    "STRING",
    (("multiline", "multiline"), ("placeholder", "placeholder"), ("dynamic_prompts", "dynamicPrompts")),
)
Boolean = _comfy_type("BOOLEAN", (("label_on", "label_on"), ("label_off", "label_off")))
Combo = _comfy_type("COMBO", (("options", "options"), ("control_after_generate", "control_after_generate")))
Image, Mask, Latent = _comfy_type("IMAGE"), _comfy_type("MASK"), _comfy_type("LATENT")
Conditioning, Model = _comfy_type("CONDITIONING"), _comfy_type("MODEL")


def Custom(io_type: str) -> type:  # noqa: N802  (the real API's name)
    return _comfy_type(io_type)


@dataclass
class Schema:
    node_id: str
    display_name: str | None = None
    category: str = "sd"
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    hidden: list = field(default_factory=list)
    description: str = ""
    is_output_node: bool = False
    not_idempotent: bool = False
    search_aliases: list = field(default_factory=list)

    def finalize(self) -> Schema:
        for i, output in enumerate(self.outputs):
            if output.id is None:
                output.id = f"_{i}_{output.io_type}_"
        ids = [i.id for i in self.inputs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"Input ids must be unique: {ids}")
        return self


class NodeOutput:
    def __init__(self, *args: Any, ui: dict | None = None, expand: dict | None = None,
                 block_execution: str | None = None):  # fmt: skip
        self.args, self.ui, self.expand, self.block_execution = args, ui, expand, block_execution

    @property
    def result(self):
        return self.args if self.args else None

    def __getitem__(self, index):
        return self.args[index]


class classproperty:  # noqa: N801  (as the real API's helper)
    def __init__(self, getter):
        self.getter = getter

    def __get__(self, obj, owner):
        return self.getter(owner)


class ComfyNode:
    """The V3 node base: subclasses define ``define_schema`` and ``execute`` (classmethods); the V1
    attributes ComfyUI's executor and ``/object_info`` read are derived from the schema."""

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError

    @classmethod
    def execute(cls, **kwargs) -> NodeOutput:
        raise NotImplementedError

    @classmethod
    def GET_SCHEMA(cls) -> Schema:  # noqa: N802
        return cls.define_schema().finalize()

    @classmethod
    def INPUT_TYPES(cls) -> dict:  # noqa: N802
        spec: dict = {"required": {}}
        for i in cls.GET_SCHEMA().inputs:
            spec.setdefault("optional" if i.optional else "required", {})[i.id] = (i.io_type, i.as_dict())
        return spec

    CATEGORY = classproperty(lambda cls: cls.GET_SCHEMA().category)
    DESCRIPTION = classproperty(lambda cls: cls.GET_SCHEMA().description)
    RETURN_TYPES = classproperty(lambda cls: [o.io_type for o in cls.GET_SCHEMA().outputs])
    RETURN_NAMES = classproperty(lambda cls: [o.display_name or o.io_type for o in cls.GET_SCHEMA().outputs])
    OUTPUT_TOOLTIPS = classproperty(lambda cls: [o.tooltip for o in cls.GET_SCHEMA().outputs])


class ComfyExtension:
    async def on_load(self) -> None:
        return None

    async def get_node_list(self) -> list:
        raise NotImplementedError


def build_modules() -> dict[str, ModuleType]:
    """``comfy_api`` and ``comfy_api.latest`` (whose ``io`` is a namespace, as in the real package)."""
    io = ModuleType("comfy_api.latest._io_public")
    for name in ("Int", "Float", "String", "Boolean", "Combo", "Image", "Mask", "Latent", "Conditioning",
                 "Model", "Custom", "Schema", "NodeOutput", "ComfyNode"):  # fmt: skip
        setattr(io, name, globals()[name])
    latest = ModuleType("comfy_api.latest")
    latest.io, latest.ComfyExtension = io, ComfyExtension
    root = ModuleType("comfy_api")
    root.__path__ = []  # a package
    root.latest = latest
    return {"comfy_api": root, "comfy_api.latest": latest}
