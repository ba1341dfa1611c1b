"""Generate every node's help page, in English and Chinese, and the Chinese locale of the node names, from
the node schemas and a hand-written part.

    python scripts/build_node_help.py          # (re)write web/docs/<NodeId>.md, web/docs/<NodeId>/zh.md and
                                               # locales/zh/nodeDefs.json
    python scripts/build_node_help.py --check  # exit 1 if the files on disk differ from what it makes

ComfyUI's node help panel fetches ``/extensions/<pack>/docs/<NodeId>/<locale>.md``, then
``/extensions/<pack>/docs/<NodeId>.md``, from the pack's ``WEB_DIRECTORY`` (``web/``). Each page is:

* the node's display name and description (English: the schema's; Chinese: the hand-written page's);
* "What it is for", hand-written in ``docs/node-help/<lang>/<NodeId>.md``;
* the inputs and outputs, generated from the schema: name, type, default, tooltip (advanced inputs marked),
  so a page cannot name an input the node lacks nor miss one it has;
* "Typical wiring" and "Common mistakes" (the message each gives), hand-written.

In the hand-written part, ``{name}`` is one of this node's inputs or outputs: it becomes the name as the
editor shows it in that language, and a name the node does not have is an error.

The Chinese page starts with the node's words in the editor (``## 界面文字``): its name and description, and
a line per input and output (``- 输入 `name` **label**：tooltip``, ``- 输出 `name` **label**：tooltip``),
each of the schema's exactly once. ``locales/zh/nodeDefs.json``, which the editor reads when its language is
中文, is made from them, keyed as the schema declares the node (inputs by name, outputs by position).
tests/test_node_help.py regenerates the pages and the locale in memory and compares them with the committed
files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workflow_builder.schemas import NODE_DOCS, REPO, NodeDoc  # noqa: E402  (the package beside this script)

HAND_WRITTEN = REPO / "docs" / "node-help"
ZH_NODE_DEFS = REPO / "locales" / "zh" / "nodeDefs.json"
LOCALE_HEADING = "## 界面文字"  # the Chinese page's first section: the node's words in the editor
LOCALE_LINE = re.compile(r"^- (输入|输出) `([A-Za-z_][A-Za-z0-9_]*)` \*\*(.+?)\*\*(?:：(.+))?$")
NAME_LINE, DESCRIPTION_LINE = "- 名称：", "- 说明："
WEB_DOCS = REPO / "web" / "docs"
LANGUAGES = ("en", "zh")
SECTIONS = {  # the hand-written sections, in order: purpose (before the tables), then wiring and mistakes
    "en": ("## What it is for", "## Typical wiring", "## Common mistakes"),
    "zh": ("## 用途", "## 典型连线", "## 常见错误"),
}
WORDS = {
    "en": {"inputs": "Inputs", "outputs": "Outputs", "input": "input", "output": "output", "type": "type",
           "default": "default", "about": "what it does", "advanced": "advanced: shown under the node's "
           "*Advanced* inputs", "optional": "optional", "none": "none", "choices": "choices"},
    "zh": {"inputs": "输入", "outputs": "输出", "input": "输入", "output": "输出", "type": "类型",
           "default": "默认值", "about": "说明", "advanced": "高级：在节点的“高级”输入中显示",
           "optional": "可选", "none": "无", "choices": "可选值"},
}  # fmt: skip
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
RAW_TAG = re.compile(r"<[A-Za-z/!]")  # the panel renders Markdown with HTML: "<name>" outside code vanishes


class HelpError(ValueError):
    pass


def zh_defs() -> dict:
    """``locales/zh/nodeDefs.json`` as made from the Chinese pages: every node, by id."""
    return {node_id: locale_entry(NODE_DOCS[node_id]) for node_id in sorted(NODE_DOCS)}


def locale_entry(doc: NodeDoc) -> dict:
    """The node's entry in ``locales/zh/nodeDefs.json``, from the first section of its Chinese page."""
    where = f"docs/node-help/zh/{doc.node_id}.md"
    lines = [line for line in _hand_written(doc, "zh")[0].splitlines()[1:] if line.strip()]
    entry, inputs, outputs = {}, {}, {}
    for line in lines:
        for key, start in (("display_name", NAME_LINE), ("description", DESCRIPTION_LINE)):
            if line.startswith(start):
                entry[key] = line[len(start) :].strip()
        if line.startswith((NAME_LINE, DESCRIPTION_LINE)):
            continue
        match = LOCALE_LINE.match(line)
        if match is None:
            raise HelpError(
                f"{where}: {line!r} is not a line of {LOCALE_HEADING} (see scripts/build_node_help.py)"
            )
        kind, name, label, tooltip = match.groups()
        named = inputs if kind == "输入" else outputs
        if name in named:
            raise HelpError(f"{where}: {LOCALE_HEADING} names `{name}` twice")
        named[name] = {"name": label, **({"tooltip": tooltip} if tooltip else {})}
    if not entry.get("display_name"):
        raise HelpError(f"{where}: {LOCALE_HEADING} needs the node's name ({NAME_LINE}...)")
    declared = ([i.name for i in doc.inputs], [o[0] for o in doc.outputs])
    for kind, given, names in (("inputs", inputs, declared[0]), ("outputs", outputs, declared[1])):
        if sorted(given) != sorted(names):
            raise HelpError(
                f"{where}: {LOCALE_HEADING} lists the {kind} {sorted(given)}, the node has {names}"
            )
    entry["inputs"] = {name: inputs[name] for name in declared[0]}
    entry["outputs"] = {str(k): outputs[name] for k, name in enumerate(declared[1])}
    return {key: entry[key] for key in ("display_name", "description", "inputs", "outputs") if key in entry}


def _label(doc: NodeDoc, lang: str, defs: dict, name: str) -> str:
    """How a page names one of the node's inputs or outputs: the identifier, with the Chinese label."""
    if lang == "en":
        return f"`{name}`"
    entry = defs.get(doc.node_id, {})
    for i, (out_name, _, _) in enumerate(doc.outputs):
        if out_name == name and not any(inp.name == name for inp in doc.inputs):
            return f"**{entry['outputs'][str(i)]['name']}**（`{name}`）"
    return f"**{entry['inputs'][name]['name']}**（`{name}`）"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(value, lang: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return f"`{value}`" if value else f"*{WORDS[lang]['none']}*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _tables(doc: NodeDoc, lang: str, defs: dict) -> str:
    w = WORDS[lang]
    entry = defs.get(doc.node_id, {})
    rows = [f"## {w['inputs']}", "", f"| {w['input']} | {w['type']} | {w['default']} | {w['about']} |",
            "|---|---|---|---|"]  # fmt: skip
    for inp in doc.inputs:
        tooltip = inp.tooltip if lang == "en" else entry["inputs"][inp.name].get("tooltip", "")
        notes = []
        if inp.optional:
            notes.append(w["optional"])
        if inp.advanced:
            notes.append(w["advanced"])
        if inp.options and len(inp.options) <= 12 and not inp.name.endswith("_name"):  # not a folder's files
            notes.append(f"{w['choices']}: " + ", ".join(f"`{o}`" for o in inp.options))
        about = _cell(tooltip) + (f" *({'; '.join(notes)})*" if notes else "")
        kind = "COMBO" if inp.options else inp.type
        label, default = _label(doc, lang, defs, inp.name), _default(inp.default, lang)
        rows.append(f"| {label} | `{kind}` | {default} | {about} |")
    rows += ["", f"## {w['outputs']}", "", f"| {w['output']} | {w['type']} | {w['about']} |", "|---|---|---|"]
    for i, (name, kind, tooltip) in enumerate(doc.outputs):
        if lang != "en":
            tooltip = entry["outputs"][str(i)].get("tooltip", "")
            label = f"**{entry['outputs'][str(i)]['name']}**（`{name}`）"
        else:
            label = f"`{name}`"
        rows.append(f"| {label} | `{kind}` | {_cell(tooltip)} |")
    return "\n".join(rows)


def _sections(doc: NodeDoc, lang: str) -> list[str]:
    """The hand-written part of the page, split at its three headings."""
    return _hand_written(doc, lang)[-3:]


def _hand_written(doc: NodeDoc, lang: str) -> list[str]:
    """The hand-written file split at its headings (each present once, in order): the Chinese one's
    ``LOCALE_HEADING``, then ``SECTIONS``."""
    path = HAND_WRITTEN / lang / f"{doc.node_id}.md"
    if not path.is_file():
        raise HelpError(f"{doc.node_id}: no hand-written help page {path.relative_to(REPO)}")
    text = path.read_text(encoding="utf-8").strip()
    heads = ((LOCALE_HEADING,) if lang == "zh" else ()) + SECTIONS[lang]
    at = [text.find(h + "\n") for h in heads]
    if text.count("\n## ") + text.startswith("## ") != len(heads) or at != sorted(at) or min(at) != 0:
        raise HelpError(f"{path.relative_to(REPO)}: needs exactly the sections {', '.join(heads)}, in order")
    return [text[a:b].strip() for a, b in zip(at, [*at[1:], len(text)])]


def _fill(doc: NodeDoc, lang: str, defs: dict, text: str, where: str) -> str:
    names = {i.name for i in doc.inputs} | {o[0] for o in doc.outputs}
    unknown = sorted(set(PLACEHOLDER.findall(text)) - names)
    if unknown:
        raise HelpError(f"{where} names {unknown}: {doc.node_id} has no such input or output {sorted(names)}")
    outside_code = re.sub(r"`[^`]*`", "", text)
    if RAW_TAG.search(outside_code):
        raise HelpError(f"{where}: put <...> placeholders inside `code` (the panel would drop them as HTML)")
    return PLACEHOLDER.sub(lambda m: _label(doc, lang, defs, m.group(1)), text)


def page(doc: NodeDoc, lang: str, defs: dict) -> str:
    where = f"docs/node-help/{lang}/{doc.node_id}.md"
    purpose, wiring, mistakes = (_fill(doc, lang, defs, s, where) for s in _sections(doc, lang))
    if lang == "en":
        title, description = doc.display_name, doc.description
    else:
        title, description = defs[doc.node_id]["display_name"], defs[doc.node_id].get("description", "")
    head = f"# {title}\n\n`{doc.node_id}`" + (f" · {description}" if description else "")
    parts = [head, purpose, _tables(doc, lang, defs), wiring, mistakes]
    return "\n\n".join(parts) + "\n"


def expected_files() -> dict[Path, str]:
    defs = zh_defs()
    files = {}
    for doc in NODE_DOCS.values():
        files[WEB_DOCS / f"{doc.node_id}.md"] = page(doc, "en", defs)
        files[WEB_DOCS / doc.node_id / "zh.md"] = page(doc, "zh", defs)
    files[ZH_NODE_DEFS] = json.dumps(defs, ensure_ascii=False, indent=2) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    try:
        files = expected_files()
    except HelpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = [p for p, text in files.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    extra = [p for p in WEB_DOCS.rglob("*.md") if p not in files] if WEB_DOCS.exists() else []
    if not args.check:
        for path in stale:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path], encoding="utf-8")
        for path in extra:
            path.unlink()
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(REPO)))
    for path in extra:
        print(("not generated: " if args.check else "removed ") + str(path.relative_to(REPO)))
    return 1 if args.check and (stale or extra) else 0


if __name__ == "__main__":
    sys.exit(main())
