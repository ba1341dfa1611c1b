"""Generate every node's help page, in English and Chinese, and the Chinese locale of the node names, from
the node schemas and a hand-written part.

    python scripts/build_node_help.py          # (re)write web/docs/<NodeId>/en.md, .../<NodeId>/zh.md,
                                               # web/docs/<NodeId>.md and locales/zh/nodeDefs.json
    python scripts/build_node_help.py --check  # exit 1 if the files on disk differ from what it makes

ComfyUI's node help panel (frontends 1.47 to 1.58 at least) fetches
``/extensions/<pack>/docs/<NodeId>/<locale>.md`` first, then ``/extensions/<pack>/docs/<NodeId>.md``,
from the pack's ``WEB_DIRECTORY`` (``web/``). The pages are written where it asks first,
``<NodeId>/en.md`` and ``<NodeId>/zh.md``, so neither language's first request fails;
``<NodeId>.md`` (the English page again) is for an editor in any other language. Each page is:

* the node's display name and description (English: the schema's; Chinese: the hand-written page's);
* "What it is for", hand-written in ``docs/node-help/<lang>/<NodeId>.md``;
* the inputs and outputs, generated from the schema: name, type, default, tooltip (advanced inputs marked),
  so a page cannot name an input the node lacks nor miss one it has. One short block each (a line with the
  name, type and default, then what it does), never a table: the panel can be 225 px wide;
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
import html
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
    "en": {"inputs": "Inputs", "outputs": "Outputs", "default": "default", "advanced": "advanced",
           "optional": "optional", "none": "none", "choices": "Choices: ", "and": ", ", "stop": ".",
           "folded": "*advanced*: folded under *Show advanced inputs* on a new node in Nodes 2.0."},
    "zh": {"inputs": "输入", "outputs": "输出", "default": "默认值", "advanced": "高级", "optional": "可选",
           "none": "无", "choices": "可选值：", "and": "、", "stop": "。",
           "folded": "*高级*：在 Nodes 2.0 中，新节点把它们收在“显示高级输入”下。"},
}  # fmt: skip
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
RAW_TAG = re.compile(r"<[A-Za-z/!]")  # the panel renders Markdown with HTML: "<name>" outside code vanishes
# The help panel wraps text only at spaces (and after hyphens): a longer run of code, a file or workflow name,
# would run past the right edge of a 225 px panel (about 24 characters of its monospace font). Such a code
# span is written as HTML instead, with a <wbr> (a break that copies as nothing) after each _ - . / , : = and
# between a lower-case letter or digit and a capital.
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LONG_CODE = 18  # characters of code between two spaces that get break points
BREAKS = re.compile(r"(?<=[-_./,:=])(?=.)|(?<=[a-z0-9])(?=[A-Z])")
ENTITIES = {c: f"&#{ord(c)};" for c in "\\*_[]~`"}  # characters Markdown would read inside the HTML
# Outside code, a run of a file name or path longer than LONG_TEXT gets a <wbr> after each _ . / -.
LONG_TEXT = 16
TEXT_RUN = re.compile(r"[A-Za-z0-9_./-]{" + str(LONG_TEXT + 1) + ",}")
TEXT_BREAKS = re.compile(r"(?<=[-_./])(?=.)")


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


def _label(doc: NodeDoc, lang: str, defs: dict, name: str, bold: bool = False) -> str:
    """How a page names one of the node's inputs or outputs: the identifier, with the Chinese label."""
    for i, (out_name, _, _) in enumerate(doc.outputs):
        if out_name == name and not any(inp.name == name for inp in doc.inputs):
            return _output_label(doc, lang, defs, i, bold)
    if lang == "en":
        return f"**`{name}`**" if bold else f"`{name}`"
    return f"**{defs[doc.node_id]['inputs'][name]['name']}**（`{name}`）"


def _output_label(doc: NodeDoc, lang: str, defs: dict, index: int, bold: bool = True) -> str:
    name = doc.outputs[index][0]
    if lang == "en":
        return f"**`{name}`**" if bold else f"`{name}`"
    return f"**{defs[doc.node_id]['outputs'][str(index)]['name']}**（`{name}`）"


def _text(text: str) -> str:
    """A tooltip as one paragraph of Markdown (the schema's line breaks are not the page's)."""
    return " ".join(str(text).split())


def _default(value, lang: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return f"`{value}`" if value else f"*{WORDS[lang]['none']}*"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _block(head: list[str], text: str) -> str:
    """One input or output: a line naming it (name, type, default, marks), then what it does. Two short
    paragraphs, never a table: the help panel can be 225 px wide, and a table cannot wrap below its widest
    cell."""
    return " · ".join(head) + ("\n\n" + text if text else "")


def _blocks(doc: NodeDoc, lang: str, defs: dict) -> str:
    """The inputs and outputs, from the schema: one block each, in the schema's order."""
    w = WORDS[lang]
    entry = defs.get(doc.node_id, {})
    parts = [f"## {w['inputs']}"]
    if any(inp.advanced for inp in doc.inputs):
        parts.append(w["folded"])
    for inp in doc.inputs:
        tooltip = inp.tooltip if lang == "en" else entry["inputs"][inp.name].get("tooltip", "")
        head = [_label(doc, lang, defs, inp.name, bold=True), f"`{'COMBO' if inp.options else inp.type}`"]
        default = _default(inp.default, lang)
        if default is not None:
            head.append(f"{w['default']} {default}")
        marks = [w[k] for k in ("optional", "advanced") if getattr(inp, k)]
        if marks:
            head.append(f"*{w['and'].join(marks)}*")
        text = _text(tooltip)
        if inp.options and len(inp.options) <= 12 and not inp.name.endswith("_name"):  # not a folder's files
            choices = w["choices"] + w["and"].join(f"`{o}`" for o in inp.options) + w["stop"]
            text = f"{text} {choices}" if text else choices
        parts.append(_block(head, text))
    parts.append(f"## {w['outputs']}")
    for i, (_, kind, tooltip) in enumerate(doc.outputs):
        if lang != "en":
            tooltip = entry["outputs"][str(i)].get("tooltip", "")
        parts.append(_block([_output_label(doc, lang, defs, i), f"`{kind}`"], _text(tooltip)))
    return "\n\n".join(parts)


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


def _html_code(code: str) -> str:
    """One code span's text as HTML, Markdown's characters as entities."""
    return "".join(ENTITIES.get(c, c) for c in html.escape(code, quote=False))


def breakable(markdown: str) -> str:
    """The page with every code span that holds a long run (``LONG_CODE``) as ``<code>`` with break points,
    and break points in every long run of a name outside code (``LONG_TEXT``)."""

    def span(match: re.Match) -> str:
        code = match.group(1)
        if all(len(word) <= LONG_CODE for word in code.split()):
            return match.group(0)
        words = re.split(r"(\s+)", code)
        return "<code>" + "".join(
            "<wbr>".join(_html_code(part) for part in BREAKS.split(word)) if len(word) > LONG_CODE
            else _html_code(word) for word in words
        ) + "</code>"  # fmt: skip

    def text(run: re.Match) -> str:
        return "<wbr>".join(TEXT_BREAKS.split(run.group(0)))

    pieces = re.split(r"(`[^`\n]+`)", markdown)  # text, code span, text, ...
    return "".join(CODE_SPAN.sub(span, p) if i % 2 else TEXT_RUN.sub(text, p) for i, p in enumerate(pieces))


def page(doc: NodeDoc, lang: str, defs: dict) -> str:
    where = f"docs/node-help/{lang}/{doc.node_id}.md"
    purpose, wiring, mistakes = (_fill(doc, lang, defs, s, where) for s in _sections(doc, lang))
    if lang == "en":
        title, description = doc.display_name, doc.description
    else:
        title, description = defs[doc.node_id]["display_name"], defs[doc.node_id].get("description", "")
    head = f"# {title}\n\n`{doc.node_id}`" + (f" · {description}" if description else "")
    parts = [head, purpose, _blocks(doc, lang, defs), wiring, mistakes]
    return breakable("\n\n".join(parts)) + "\n"


def expected_files() -> dict[Path, str]:
    defs = zh_defs()
    files = {}
    for doc in NODE_DOCS.values():
        english = page(doc, "en", defs)
        files[WEB_DOCS / doc.node_id / "en.md"] = english
        files[WEB_DOCS / f"{doc.node_id}.md"] = english  # the fallback: any other language
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
