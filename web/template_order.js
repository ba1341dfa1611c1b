// Made by scripts/build_workflows.py: do not edit.
// The template browser lists this pack's workflows in the order the server finds the files (the file
// system's). This puts them in the order a newcomer needs them, the first-run workflows first, and leaves out
// the old names of the workflows that also ship under a title-like name (the same graphs).
import { api } from "../../scripts/api.js";

const ORDER = [
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
    "flux1_fill_outpaint"
];
const HIDDEN = new Set(["flux2_klein_4b_edit", "flux2_klein_4b_text_to_image"]);
const pack = new URL(import.meta.url).pathname.split("/")[2];  // /extensions/<pack folder>/...
const rank = (name) => (ORDER.includes(name) ? ORDER.indexOf(name) : ORDER.length);
const listed = api.getWorkflowTemplates.bind(api);

api.getWorkflowTemplates = async () => {
    const templates = await listed();
    const ours = templates?.[decodeURIComponent(pack)];
    if (Array.isArray(ours)) {
        templates[decodeURIComponent(pack)] = ours
            .filter((name) => !HIDDEN.has(name))
            .map((name, i) => [rank(name), i, name])
            .sort((a, b) => a[0] - b[0] || a[1] - b[1])
            .map(([, , name]) => name);
    }
    return templates;
};
