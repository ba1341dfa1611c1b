"""A small graph builder: nodes with their widget values, typed links checked against the node schemas, and
groups. ``formats`` turns a graph into the editor and the API format."""

from __future__ import annotations

from dataclasses import dataclass, field

from .schemas import NODE_DOCS, NODE_SPECS, NodeSpec
from .sizes import stored_size


@dataclass
class Node:
    id: int
    type: str
    values: dict  # widget name -> value (every widget of the spec except frontend-only ones)
    col: str  # the column it is drawn in (``sizes.arrange`` turns columns into positions)
    size: tuple[float, float]
    pos: tuple[float, float] = (0, 0)
    title: str | None = None
    color: str | None = None
    bgcolor: str | None = None
    properties: dict = field(default_factory=dict)
    show_advanced: bool = False  # opens with its advanced inputs shown in Nodes 2.0 (else folded)
    links_in: dict = field(default_factory=dict)  # input name -> link id

    @property
    def spec(self) -> NodeSpec:
        return NODE_SPECS[self.type]


@dataclass
class Link:
    id: int
    src: Node
    src_slot: int
    dst: Node
    dst_input: str

    @property
    def type(self) -> str:
        return self.src.spec.outputs[self.src_slot][1]


@dataclass
class Group:
    title: str
    nodes: list[Node]
    color: str = "#3f789e"


class Graph:
    def __init__(self, name: str, title: str = "", details: str = ""):
        self.name = name
        self.title = title  # the workflow's title (its note's heading)
        self.details = details  # its section of docs/workflows.md (Markdown, the title as a level-1 heading)
        self.nodes: list[Node] = []
        self.links: list[Link] = []
        self.groups: list[Group] = []

    def add(self, type_: str, col: str, size, values: dict | None = None, **kw) -> Node:
        spec = NODE_SPECS[type_]
        values = dict(values or {})
        expected = [w.name for w in spec.widgets if w.in_api or spec.frontend_only]
        if sorted(values) != sorted(expected):
            raise ValueError(f"{type_}: widgets {sorted(values)} != {sorted(expected)}")
        if "show_advanced" not in kw:  # shown where the workflow sets one away from its default
            doc = NODE_DOCS.get(type_)
            kw["show_advanced"] = doc is not None and any(
                i.advanced and i.name in values and values[i.name] != i.default for i in doc.inputs
            )
        size = stored_size(type_, size, values, kw.get("title"), kw["show_advanced"])
        node = Node(len(self.nodes) + 1, type_, values, col, size, **kw)
        if not spec.frontend_only:
            node.properties = {"Node name for S&R": type_, **node.properties}
        self.nodes.append(node)
        return node

    def connect(self, src: Node, dst: Node, dst_input: str, src_slot: int = 0) -> None:
        sockets = {s.name: s for s in dst.spec.inputs}
        if dst_input not in sockets:
            raise ValueError(f"{dst.type} has no input {dst_input!r}")
        if dst_input in dst.links_in:
            raise ValueError(f"{dst.type}.{dst_input} is already linked")
        link = Link(len(self.links) + 1, src, src_slot, dst, dst_input)
        if sockets[dst_input].type not in (link.type, "*"):
            raise ValueError(f"type mismatch: {src.type}[{src_slot}] {link.type} -> {dst.type}.{dst_input}")
        self.links.append(link)
        dst.links_in[dst_input] = link.id

    def group(self, title: str, *nodes: Node) -> None:
        self.groups.append(Group(title, list(nodes)))

    def order(self) -> dict[int, int]:
        deps = {n.id: {lk.src.id for lk in self.links if lk.dst is n} for n in self.nodes}
        order, done = {}, set()
        while len(done) < len(self.nodes):
            ready = [i for i in sorted(deps) if i not in done and deps[i] <= done]
            if not ready:
                raise ValueError(f"{self.name}: cycle in graph")
            order[ready[0]] = len(order)
            done.add(ready[0])
        return order


def input_index(node: Node, name: str) -> int:
    """The slot of ``name`` among ``node``'s link inputs."""
    return [s.name for s in node.spec.inputs].index(name)
