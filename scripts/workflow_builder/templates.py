"""How the template browser shows the bundled workflows, and the page that says more about each.

The editor lists a pack's workflows under *Templates > Extensions* as cards named by their file names (title,
description and search read only the name: frontends 1.47 and 1.58 fetch nothing else about a pack's
workflows), in the order the server lists the files, which is the file system's (ComfyUI 0.29 globs the
folder; newer cores go through a set). So:

* the first-run workflows also ship under names that read as titles, sort before every other name (A-Z, and
  in the file order of Windows' NTFS) and hold the words a newcomer types ("klein text to image", "klein
  edit"): ``ALIASES``. Their old names stay (the same graph, both formats: they are contracts) and are kept
  off the cards;
* ``web/template_order.js`` hands the editor the pack's list in ``ORDER`` (first-run workflows first), the old
  names of the aliases left out, whatever order the server found the files in;
* ``docs/workflows.md`` holds what each workflow's short note leaves out.
"""

from __future__ import annotations

import json

# title-like file name -> the workflow it is a second name of
ALIASES = {
    "FLUX.2 klein text to image": "flux2_klein_4b_text_to_image",
    "FLUX.2 klein edit": "flux2_klein_4b_edit",
}
# The cards in the order a newcomer needs them: first run, then klein 4B by task, 9B-KV, dev, FLUX.1 Fill.
ORDER = (
    "FLUX.2 klein text to image",
    "FLUX.2 klein edit",
    "flux2_klein_4b_multi_reference_edit",
    "flux2_klein_4b_edit_reference_strength",
    "flux2_klein_4b_regional_edit",
    "flux2_klein_4b_regional_prompt",
    "flux2_klein_4b_img2img",
    "flux2_klein_4b_inpaint",
    "flux2_klein_4b_outpaint",
    "flux2_klein_4b_upscale_2x",
    "flux2_klein_4b_text_to_image_4mp",
    "flux2_klein_4b_lora",
    "flux2_klein_4b_base_text_to_image",
    "flux2_klein_4b_refcontrol_depth",
    "flux2_klein_4b_native_sampler",
    "flux2_klein_4b_native_easycache",
    "flux2_klein_9b_kv_edit",
    "flux2_dev_text_to_image",
    "flux2_dev_multi_reference_edit",
    "flux2_dev_lora",
    "flux2_dev_turbo",
    "flux2_dev_controlnet_pose",
    "flux2_dev_controlnet_inpaint",
    "flux1_fill_inpaint",
    "flux1_fill_outpaint",
)

ORDER_SCRIPT = """// Made by scripts/build_workflows.py: do not edit.
// The template browser lists this pack's workflows in the order the server finds the files (the file
// system's). This puts them in the order a newcomer needs them, the first-run workflows first, and leaves out
// the old names of the workflows that also ship under a title-like name (the same graphs).
import {{ api }} from "../../scripts/api.js";

const ORDER = {order};
const HIDDEN = new Set({hidden});
const pack = new URL(import.meta.url).pathname.split("/")[2];  // /extensions/<pack folder>/...
const rank = (name) => (ORDER.includes(name) ? ORDER.indexOf(name) : ORDER.length);
const listed = api.getWorkflowTemplates.bind(api);

api.getWorkflowTemplates = async () => {{
    const templates = await listed();
    const ours = templates?.[decodeURIComponent(pack)];
    if (Array.isArray(ours)) {{
        templates[decodeURIComponent(pack)] = ours
            .filter((name) => !HIDDEN.has(name))
            .map((name, i) => [rank(name), i, name])
            .sort((a, b) => a[0] - b[0] || a[1] - b[1])
            .map(([, , name]) => name);
    }}
    return templates;
}};
"""


def order_script(names) -> str:
    """``web/template_order.js`` for the workflows ``names`` (every one of them in ``ORDER``)."""
    missing = sorted(set(names) - set(ORDER) - set(ALIASES.values()))
    if missing:
        raise ValueError(f"workflows missing from templates.ORDER: {missing}")
    order = [name for name in ORDER if name in names]
    return ORDER_SCRIPT.format(order=json.dumps(order, indent=4), hidden=json.dumps(sorted(ALIASES.values())))


DETAILS_HEAD = """# The bundled workflows

Made by `scripts/build_workflows.py` from the same description as the workflows: do not edit. Each workflow
carries a short note (what it does, the files and their folders, the usual settings); this page says the
rest. Open them from *Templates > Extensions > FLUX.2 [klein]* or drag the file from `workflows/` onto the
canvas; the same graphs in API format are in `workflows/api/`. `FLUX.2 klein text to image` and
`FLUX.2 klein edit` are the same workflows as `flux2_klein_4b_text_to_image` and `flux2_klein_4b_edit` (see
[the graph editor](editor.md#templates)).
"""


def details_page(graphs) -> str:
    """``docs/workflows.md``: each workflow's section (its long note, headings a level down), card order."""
    by_name = {g.name: g for g in graphs}
    sections = []
    for name in ORDER:
        g = by_name.get(ALIASES.get(name, name))
        if g is None:
            continue
        text = g.details.strip().replace("\n## ", "\n### ")
        title, body = text.split("\n", 1)
        files = f"`workflows/{g.name}.json`" + (f", also `workflows/{name}.json`" if name in ALIASES else "")
        sections.append(f"#{title}\n\n{files}\n{body}\n")
    return DETAILS_HEAD + "\n" + "\n".join(sections)
