"""The two ComfyUI formats of one graph: the graph-editor format (version 0.4) the frontend saves and loads,
and the API format ``POST /prompt`` accepts (``{node_id: {"class_type", "inputs", "_meta"}}``, links as
``[node_id, output_slot]``, frontend-only nodes left out), and the JSON text they are committed as."""

from __future__ import annotations

import json
import uuid

from .graph import Graph, input_index
from .layout import lay_out
from .sizes import check_group_titles, group_box, view

WORKFLOW_ID = "comfyui-flux2-klein/workflows/"  # + the name: the uuid5 of each editor workflow's id


def to_editor(graph: Graph) -> dict:
    """The graph-editor format (0.4) ComfyUI's frontend saves and loads, laid out as the editor draws it."""
    lay_out(graph)
    check_group_titles(graph)
    order = graph.order()
    nodes = []
    for n in graph.nodes:
        spec = n.spec
        inputs = []
        for s in spec.inputs:
            entry = {"localized_name": s.name, "name": s.name}
            if s.optional:
                entry["shape"] = 7
            entry.update(type=s.type, link=n.links_in.get(s.name))
            inputs.append(entry)
        widgets_values = []
        for w in spec.widgets:
            if not spec.frontend_only:
                entry = {"localized_name": w.label or w.name, "name": w.name}
                if w.optional:
                    entry["shape"] = 7
                entry.update(type=w.type, widget={"name": w.name}, link=None)
                inputs.append(entry)
            if w.type == "IMAGEUPLOAD":
                widgets_values.append("image")  # what the frontend stores for the upload button
                continue
            widgets_values.append(n.values[w.name])
            if w.control_after_generate:
                widgets_values.append("randomize")
        outputs = [
            {
                "localized_name": name,
                "name": name,
                "type": type_,
                "links": [lk.id for lk in graph.links if lk.src is n and lk.src_slot == slot],
                "slot_index": slot,
            }
            for slot, (name, type_) in enumerate(spec.outputs)
        ]
        node = {
            "id": n.id,
            "type": n.type,
            "pos": list(n.pos),
            "size": list(n.size),
            "flags": {},
            "order": order[n.id],
            "mode": 0,
            **({"showAdvanced": True} if n.show_advanced else {}),
            "inputs": inputs,
            "outputs": outputs,
        }
        if n.title:
            node["title"] = n.title
        node["properties"] = n.properties
        node["widgets_values"] = widgets_values
        if n.color:
            node.update(color=n.color, bgcolor=n.bgcolor)
        nodes.append(node)
    links = [
        [lk.id, lk.src.id, lk.src_slot, lk.dst.id, input_index(lk.dst, lk.dst_input), lk.type]
        for lk in graph.links
    ]
    groups = []
    for i, g in enumerate(graph.groups, 1):
        x0, y0, x1, y1 = group_box(g.nodes)
        bounding = [x0, y0, x1 - x0, y1 - y0]
        groups.append(
            {
                "id": i,
                "title": g.title,
                "bounding": bounding,
                "color": g.color,
                "font_size": 24,
                "flags": {},
            }
        )
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, WORKFLOW_ID + graph.name)),
        "revision": 0,
        "last_node_id": max(n.id for n in graph.nodes),
        "last_link_id": max((lk.id for lk in graph.links), default=0),
        "nodes": nodes,
        "links": links,
        "groups": groups,
        "config": {},
        "extra": {"ds": view(graph)},
        "version": 0.4,
    }


def to_api(graph: Graph) -> dict:
    """The API format ``POST /prompt`` accepts as-is; frontend-only nodes (notes) left out."""
    api = {}
    for n in graph.nodes:
        spec = n.spec
        if spec.frontend_only:
            continue
        inputs = {}
        for w in spec.widgets:
            if w.in_api:
                inputs[w.name] = n.values[w.name]
        for s in spec.inputs:
            if s.name in n.links_in:
                lk = graph.links[n.links_in[s.name] - 1]
                inputs[s.name] = [str(lk.src.id), lk.src_slot]
        api[str(n.id)] = {
            "inputs": inputs,
            "class_type": n.type,
            "_meta": {"title": n.title or spec.display_name},
        }
    return api


def render(obj) -> str:
    """JSON text as committed: 2-space indent, lists of plain values kept on one line."""
    return _render(obj, 0) + "\n"


def _render(obj, level: int) -> str:
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {_render(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [f"{inner}{_render(v, level + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj, ensure_ascii=False)
