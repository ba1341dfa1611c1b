"""The node help pages (web/docs) and the Chinese locale (locales/zh/nodeDefs.json), both made by
scripts/build_node_help.py from the schemas and the hand-written pages: every node has both, in step with its
schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[1]


help_pages = load_script("build_node_help")
DOCS = help_pages.NODE_DOCS  # every registered node, read from its class under the fake host


def test_the_committed_pages_are_the_generated_ones():
    # the help panel asks /extensions/<pack>/docs/<NodeId>/<locale>.md first, then <NodeId>.md: each node has
    # a page where it asks first in English and Chinese, and the English one again for other languages
    files = help_pages.expected_files()
    assert {p.relative_to(REPO).as_posix() for p in files} == {
        f"web/docs/{n}{page}" for n in DOCS for page in (".md", "/en.md", "/zh.md")
    } | {"locales/zh/nodeDefs.json"}
    for n in DOCS:
        assert files[REPO / "web" / "docs" / n / "en.md"] == files[REPO / "web" / "docs" / f"{n}.md"]
    stale = [str(p.relative_to(REPO)) for p, text in files.items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]  # fmt: skip
    assert not stale, f"run python scripts/build_nodes.py: {stale}"
    generated = {p.resolve() for p in files}
    assert not [p for p in (REPO / "web" / "docs").rglob("*.md") if p.resolve() not in generated]


@pytest.mark.parametrize("node_id", sorted(DOCS))
def test_every_node_has_a_hand_written_page_in_both_languages(node_id):
    for lang in help_pages.LANGUAGES:
        assert (REPO / "docs" / "node-help" / lang / f"{node_id}.md").is_file(), (node_id, lang)
        page = help_pages.page(DOCS[node_id], lang, help_pages.zh_defs())
        for heading in help_pages.SECTIONS[lang]:
            assert heading in page
        for inp in DOCS[node_id].inputs:  # the generated blocks list every input of the schema
            assert f"`{inp.name}`" in page or _as_html(inp.name) in page, (node_id, lang, inp.name)


def _as_html(code: str) -> str:
    return "<code>" + code.replace("_", "&#95;<wbr>") + "</code>"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_page_fits_a_narrow_panel(lang):
    # no table (a table cannot wrap below its widest cell: 699 px in a 225 px panel), one block per input
    # and output: a line naming it, then what it does; no run of code longer than LONG_CODE without a break
    defs = help_pages.zh_defs()
    for node_id, doc in DOCS.items():
        page = help_pages.page(doc, lang, defs)
        assert not [line for line in page.splitlines() if line.startswith("|")], node_id
        blocks = page.split(f"\n## {help_pages.WORDS[lang]['inputs']}\n", 1)[1].split("\n## ")
        inputs, outputs = blocks[0], blocks[1]
        heads = [p for p in inputs.strip().split("\n\n") if p.startswith("**")]
        assert len(heads) == len(doc.inputs), node_id
        for head, inp in zip(heads, doc.inputs):
            assert inp.name in head.replace("&#95;", "_").replace("<wbr>", ""), (node_id, head)
            assert (help_pages.WORDS[lang]["advanced"] in head) == inp.advanced, (node_id, head)
        assert len([p for p in outputs.strip().split("\n\n") if p.startswith("**")]) == len(doc.outputs)
        for span in help_pages.CODE_SPAN.findall(page):
            assert all(len(word) <= help_pages.LONG_CODE for word in span.split()), (node_id, span)
        text = help_pages.CODE_SPAN.sub("", page)
        for run in help_pages.TEXT_RUN.findall(text):  # a long name outside code: broken after _ . / -
            assert not help_pages.TEXT_BREAKS.search(run), (node_id, run)


def test_long_code_gets_break_points_that_copy_as_nothing():
    made = help_pages.breakable("Put `mistral_3_small_flux2_bf16.safetensors` in `models/unet`.")
    assert made == (
        "Put <code>mistral&#95;<wbr>3&#95;<wbr>small&#95;<wbr>flux2&#95;<wbr>bf16.<wbr>safetensors</code> "
        "in `models/unet`."
    )
    # a long node id breaks between its words; Markdown's characters are entities, HTML is escaped
    assert help_pages.breakable("`Flux1FillTextEncoderLoader`") == (
        "<code>Flux1<wbr>Fill<wbr>Text<wbr>Encoder<wbr>Loader</code>"
    )
    assert help_pages.breakable("`a *b* <c> very_long_identifier_name`") == (
        "<code>a &#42;b&#42; &lt;c&gt; very&#95;<wbr>long&#95;<wbr>identifier&#95;<wbr>name</code>"
    )
    assert help_pages.breakable("`short_name`") == "`short_name`"
    assert help_pages.breakable("put it in models/diffusion_models, or `x`") == (
        "put it in models/<wbr>diffusion_<wbr>models, or `x`"
    )


def test_a_page_naming_an_input_the_node_lacks_is_refused():
    doc = DOCS["Flux2KleinSampler"]
    defs = help_pages.zh_defs()
    assert "`seed`" in help_pages._fill(doc, "en", defs, "Set {seed}.", "test")
    assert "**种子**（`seed`）" == help_pages._fill(doc, "zh", defs, "{seed}", "test")
    with pytest.raises(help_pages.HelpError, match="sampler_name"):
        help_pages._fill(doc, "en", defs, "Set {sampler_name}.", "test")
    with pytest.raises(help_pages.HelpError, match="code"):
        help_pages._fill(doc, "en", defs, 'It says "loading <file> failed".', "test")


@pytest.mark.parametrize("node_id", sorted(DOCS))
def test_the_chinese_locale_covers_every_input_and_output(node_id):
    entry = help_pages.zh_defs()[node_id]
    doc = DOCS[node_id]
    assert entry["display_name"] and entry["display_name"] != doc.display_name
    assert entry.get("description") or not doc.description
    assert list(entry["inputs"]) == [i.name for i in doc.inputs], "zh inputs differ from the schema's"
    for inp in doc.inputs:
        assert entry["inputs"][inp.name]["name"], (node_id, inp.name)
        assert bool(entry["inputs"][inp.name].get("tooltip")) == bool(inp.tooltip), (node_id, inp.name)
    assert sorted(entry["outputs"], key=int) == [str(i) for i in range(len(doc.outputs))]
    for i, (_, _, tooltip) in enumerate(doc.outputs):
        assert bool(entry["outputs"][str(i)].get("tooltip")) == bool(tooltip), (node_id, i)


def test_the_chinese_words_come_from_the_page_and_follow_the_schema(monkeypatch, tmp_path):
    # locales/zh/nodeDefs.json is made from each Chinese page's first section, keyed as the schema declares
    doc = DOCS["Flux2KleinDecode"]
    text = (REPO / "docs" / "node-help" / "zh" / "Flux2KleinDecode.md").read_text(encoding="utf-8")
    assert text.startswith(help_pages.LOCALE_HEADING + "\n")
    entry = help_pages.locale_entry(doc)
    assert list(entry["inputs"]) == ["vae", "latent", "tile_size", "tile_overlap"]
    assert list(entry["outputs"]) == ["0"]
    (tmp_path / "zh").mkdir()
    monkeypatch.setattr(help_pages, "HAND_WRITTEN", tmp_path)
    without_latent = "\n".join(line for line in text.splitlines() if "`latent`" not in line)
    for changed, message in (
        (text.replace("- 输入 `tile_overlap`", "- 输入 `overlap`"), "lists the inputs"),  # not the node's
        (without_latent, "lists the"),  # one left out
        (text.replace("- 名称：", "- 名字："), "is not a line of"),
    ):
        (tmp_path / "zh" / "Flux2KleinDecode.md").write_text(changed, encoding="utf-8")
        with pytest.raises(help_pages.HelpError, match=message):
            help_pages.locale_entry(doc)


def test_the_chinese_locale_names_every_category_and_no_unknown_node():
    assert set(help_pages.zh_defs()) == set(DOCS)
    main = json.loads((REPO / "locales" / "zh" / "main.json").read_text(encoding="utf-8"))
    categories = main["nodeCategories"]
    for doc in DOCS.values():
        for part in doc.category.split("/"):
            assert categories.get(part), f"{doc.node_id}: category {part!r} has no Chinese name"


def test_comfyui_serves_the_pages_from_the_web_directory():
    # ComfyUI serves a pack's WEB_DIRECTORY under /extensions/<folder>/; the help panel asks for docs/ there
    source = (REPO / "__init__.py").read_text(encoding="utf-8")
    assert 'WEB_DIRECTORY = "./web"' in source
    assert (REPO / "web" / "docs" / "Flux2KleinSampler" / "en.md").is_file()
    # the editor loads every .js file under WEB_DIRECTORY as a frontend extension: none among the pages
    assert {p.suffix for p in (REPO / "web" / "docs").rglob("*") if p.is_file()} == {".md"}


def test_every_template_card_has_its_thumbnail_and_the_section_its_name():
    # the template browser asks for /api/workflow_templates/<pack folder>/<name>.jpg (made in the real editor
    # by scripts/frontend_pictures.py) and names the pack's section by templateWorkflows.category.<folder> in
    # the editor's locale
    from PIL import Image

    workflows = REPO / "workflows"
    names = sorted(p.stem for p in workflows.glob("*.json"))
    assert sorted(p.stem for p in workflows.glob("*.jpg")) == names
    for name in names:
        with Image.open(workflows / f"{name}.jpg") as picture:
            assert picture.format == "JPEG" and picture.size == (800, 600), name
            shades = picture.convert("L").resize((40, 30)).tobytes()
            assert len(set(shades)) > 8, f"{name}.jpg is blank"
    for lang in ("en", "zh"):
        main = json.loads((REPO / "locales" / lang / "main.json").read_text(encoding="utf-8"))
        assert main["templateWorkflows"]["category"]["comfyui-flux2-klein"] == "FLUX.2 [klein]", lang
        assert main["nodeCategories"]["flux2_klein"] == "FLUX.2 [klein]", lang
