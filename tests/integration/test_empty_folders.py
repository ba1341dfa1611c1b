"""A newcomer's ComfyUI with empty model folders: the loaders say what to get and where, never crash."""

from __future__ import annotations

import pytest
from node_contract import choices

KLEIN, DEV = "Comfy-Org/flux2-klein", "Comfy-Org/flux2-dev"
LINKS = {  # node -> (widget, folder, the file to get, its repo)
    "Flux2KleinModelLoader": ("model_name", "diffusion_models", "flux-2-klein-4b.safetensors", KLEIN),
    "Flux2KleinTextEncoderLoader": ("text_encoder_name", "text_encoders", "qwen_3_4b.safetensors", KLEIN),
    "Flux2KleinVAELoader": ("vae_name", "vae", "flux2-vae.safetensors", DEV),
}


@pytest.mark.parametrize("node_type", sorted(LINKS))
def test_an_empty_folder_shows_in_the_list_and_the_loader_names_the_file_and_link(empty_comfy, node_type):
    widget, folder, filename, repo = LINKS[node_type]
    (choice,) = choices(empty_comfy.object_info()[node_type]["input"]["required"][widget])
    assert choice == f"(models/{folder} is empty: get {filename})"
    inputs = {widget: choice}
    if node_type == "Flux2KleinModelLoader":
        inputs["variant"] = "auto"
    # A loader alone cannot be queued (it is no output node): ComfyUI's "Preview as Text" takes any output.
    graph = {
        "1": {"class_type": node_type, "inputs": inputs},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    with pytest.raises(empty_comfy.kc.ExecutionFailed) as failure:
        empty_comfy.run(graph, timeout=60)
    data = failure.value.data
    assert data["node_type"] == node_type and data["exception_type"] == "Flux2Error", data
    message = data["exception_message"]
    url = f"https://huggingface.co/{repo}/resolve/main/split_files/{folder}/{filename}"
    assert f"download {filename}" in message and url in message and f"ComfyUI/models/{folder}/" in message
