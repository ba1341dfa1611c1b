"""Progress in a real ComfyUI: FLUX.2 Decode and Encode and FLUX.1 Fill [dev] Decode, queued over the HTTP
API, send ``progress`` messages for their own node over the websocket while they run (per encoder or decoder
stage of each tile, ``flux2_core.vae.progress``): the first at 0 before any work, the last at the node's total
(one thousand per image), never going down, and some in between, so the node's bar moves; and the
``progress_state`` messages the frontend's queue total reads show the node running part way. A cancel while
a decode runs stops it."""

from __future__ import annotations

import pytest
from comfy_server import FILL_FILES, VAE_FILE

PER_IMAGE = 1000  # flux2_core.vae.progress.PER_RUN


def _node(class_type: str, **inputs) -> dict:
    return {"class_type": class_type, "inputs": inputs}


def _events(comfy, graph: dict) -> list[tuple[str, dict]]:
    events = []
    comfy.run(graph, timeout=600, on_event=lambda kind, data: events.append((kind, data)))
    assert any(kind == "progress" for kind, _ in events), (
        "no progress message came over the websocket (is websocket-client installed?)"
    )
    return events


def _check_bar(events, node: str, images: int) -> None:
    """``node``'s progress messages: the total known from the first, 0 first, the total last, never down,
    some in between; and its state in the queue's messages once running part way, finished at the end."""
    counts = [(d["value"], d["max"]) for kind, d in events if kind == "progress" and d["node"] == node]
    values = [value for value, _ in counts]
    print(f"node {node}: {len(counts)} progress messages: {values}")
    assert counts, f"node {node} sent no progress message"
    assert {total for _, total in counts} == {images * PER_IMAGE}, counts
    assert values[0] == 0 and values[-1] == images * PER_IMAGE and values == sorted(values), counts
    assert len(set(values)) >= 3, f"node {node}'s bar only started and finished: {counts}"
    states = [d["nodes"][node] for kind, d in events if kind == "progress_state" and node in d["nodes"]]
    assert any(s["state"] == "running" and 0 < s["value"] < s["max"] for s in states), states
    assert states[-1]["state"] == "finished"


def test_flux2_decode_and_encode_report_progress_over_the_websocket(comfy):
    vae = ["1", 0]
    graph = {
        "1": _node("Flux2KleinVAELoader", vae_name=VAE_FILE),
        "2": _node("EmptyImage", width=256, height=192, batch_size=1, color=0x3366AA),
        "3": _node("Flux2KleinEncode", vae=vae, image=["2", 0]),
        "4": _node("EmptyFlux2LatentImage", width=512, height=512, batch_size=2),
        "5": _node("Flux2KleinDecode", vae=vae, latent=["4", 0]),
        "6": _node("PreviewImage", images=["5", 0]),
        # a tiled decode of the encoded image: 128 px tiles sharing 32 px, 3 x 2 of them
        "7": _node("Flux2KleinDecode", vae=vae, latent=["3", 0], tile_size=128, tile_overlap=32),
        "8": _node("PreviewImage", images=["7", 0]),
    }
    events = _events(comfy, graph)
    _check_bar(events, "5", images=2)  # a batch of two: one image after the other on one bar
    _check_bar(events, "3", images=1)
    _check_bar(events, "7", images=1)


def test_flux1_fill_decode_reports_progress_over_the_websocket(comfy):
    graph = {
        "1": _node("Flux1FillVAELoader", vae_name=FILL_FILES["vae"]),
        "2": _node("EmptySD3LatentImage", width=512, height=384, batch_size=1),  # FLUX.1's 16 channels
        "3": _node("Flux1FillDecode", vae=["1", 0], latent=["2", 0]),
        "4": _node("PreviewImage", images=["3", 0]),
    }
    _check_bar(_events(comfy, graph), "3", images=1)


def test_a_cancel_during_a_decode_stops_it(comfy):
    """Interrupting while FLUX.2 Decode runs ends the run between two decoder stages (the cancel is a
    BaseException that goes up unchanged), and the server keeps serving."""
    graph = {
        "1": _node("Flux2KleinVAELoader", vae_name=VAE_FILE),
        "2": _node("EmptyFlux2LatentImage", width=1024, height=1024, batch_size=4),
        "3": _node("Flux2KleinDecode", vae=["1", 0], latent=["2", 0]),
        "4": _node("PreviewImage", images=["3", 0]),
    }
    seen = []

    def cancel_once_decoding(kind, data):
        if kind == "progress" and data["node"] == "3" and data["value"] > 0 and not seen:
            seen.append(data["value"])
            comfy.post_json("/interrupt", {})

    with pytest.raises(comfy.kc.Interrupted):
        comfy.run(graph, timeout=600, on_event=cancel_once_decoding)
    assert seen and seen[0] < 4 * PER_IMAGE
    graph["2"]["inputs"]["width"] = 256  # still serving: a small decode runs to its end
    _check_bar(_events(comfy, graph), "3", images=4)
