"""Run a bundled FLUX.2 [klein] API workflow on a ComfyUI server, from the command line or from Python.

    python scripts/klein_client.py --server http://127.0.0.1:8188 \\
        --workflow workflows/api/flux2_klein_4b_edit.json \\
        --prompt "turn the drawing into a photograph" --image drawing.png --output-dir out/

What it does:

1. uploads every ``--image`` with ``POST /upload/image`` (overwriting a file of the same name) and puts the
   names the server returns into the workflow's ``LoadImage`` nodes, in node-id order. If there are fewer
   images than ``LoadImage`` nodes, the unused references are cut out of the reference chain (so the
   2-reference 9B-KV workflow also runs with one image). Without ``--image`` the nodes keep their file names;
2. sets ``--prompt`` on the text-encode node wired to the sampler's ``positive`` input (``--negative`` on the
   one wired to ``negative``), ``--seed`` on every sampler, and each ``--set NODE.INPUT=VALUE``;
3. queues it with ``POST /prompt``, follows progress over the ``/ws`` websocket (when ``websocket-client`` is
   installed; otherwise it polls ``/history``), and
4. downloads every output image with ``GET /view`` into ``--output-dir``.

Exit codes: 0 success; 1 cannot talk to the server / bad arguments; 2 usage error (argparse); 3 the server
rejected the workflow (validation errors per node are printed); 4 a node failed while running; 5 the run was
interrupted; 6 timed out.

The functions ``upload_image``, ``queue``, ``wait``, ``fetch_outputs`` (and the workflow-patching helpers) can
be imported; only the standard library is needed, plus ``websocket-client`` for live progress.
"""

from __future__ import annotations

import argparse
import copy
import json
import mimetypes
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

try:  # optional: live progress over the websocket
    import websocket  # websocket-client
except ImportError:  # pragma: no cover - depends on the environment
    websocket = None

# FLUX.2 [klein], FLUX.1 Fill [dev], FLUX.2 Tiled Refine (the upscale workflow: its prompt and seed)
SAMPLER = ("Flux2KleinSampler", "Flux1FillSampler", "Flux2KleinTiledRefine")
# Native sampling of our model (the native-sampler workflows): the guider holds the prompts, noise the seed
NATIVE_SAMPLER, NATIVE_NOISE, KSAMPLER = "SamplerCustomAdvanced", "RandomNoise", "KSampler"
GUIDER_INPUTS = {"CFGGuider": {"positive": "positive", "negative": "negative"},
                 "BasicGuider": {"positive": "conditioning"}}  # fmt: skip
# nodes a conditioning passes through unchanged in text, on its way from the text encode to the guider
CONDITIONING_PASSTHROUGH = (  # followed through their "conditioning" input (regions: to the global prompt)
    "Flux2KleinToNativeConditioning", "ReferenceLatent", "FluxGuidance", "Flux2KleinRegionalPrompt",
    "Flux2DevApplyControlNet",
)  # fmt: skip
TEXT_ENCODE = ("Flux2KleinTextEncode", "Flux1FillTextEncode")
REFERENCE_ENCODE = "Flux2KleinReferenceEncode"
LOAD_IMAGE = "LoadImage"


class ComfyError(RuntimeError):
    """Something went wrong talking to ComfyUI; ``exit_code`` says what (see the module docstring)."""

    exit_code = 1


class PromptRejected(ComfyError):
    """``POST /prompt`` answered 400: the workflow did not validate."""

    exit_code = 3

    def __init__(self, body: dict):
        self.body = body
        super().__init__(format_prompt_error(body))


class ExecutionFailed(ComfyError):
    """A node raised while the prompt ran."""

    exit_code = 4

    def __init__(self, data: dict):
        self.data = data
        node = data.get("node_id")
        kind = data.get("node_type") or "?"
        kind_of_error = str(data.get("exception_type") or "error").rsplit(".", 1)[-1]  # drop the module path
        error = f"{kind_of_error}: {data.get('exception_message', '')}".strip()
        super().__init__(f"node {node} ({kind}) failed: {error}")


class Interrupted(ComfyError):
    exit_code = 5


class TimedOut(ComfyError):
    exit_code = 6


# ----------------------------------------------------------------------------------------------------
# Workflow patching (pure functions on API-format dicts; nothing here talks to a server)


def load_workflow(path: str | Path) -> dict:
    """Read an API-format workflow; an editor-format file gets a clear error."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict) and "nodes" in data and "links" in data:
        raise ComfyError(
            f"{path} is an editor (UI) workflow; use the API-format file of the same name in workflows/api/"
        )
    if not isinstance(data, dict) or not all(
        isinstance(v, dict) and "class_type" in v for v in data.values()
    ):
        raise ComfyError(f"{path} is not an API-format workflow ({{node_id: {{class_type, inputs}}}})")
    return data


def nodes_of_type(workflow: dict, class_type: str | tuple[str, ...]) -> list[str]:
    """Ids of the nodes of one type (or of any of several), in numeric id order."""
    types = (class_type,) if isinstance(class_type, str) else class_type
    ids = [i for i, n in workflow.items() if n["class_type"] in types]
    return sorted(ids, key=_id_key)


def _id_key(node_id: str):
    return (0, int(node_id), "") if str(node_id).isdigit() else (1, 0, str(node_id))


def _is_link(value) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
    )


def linked_node(workflow: dict, node_id: str, input_name: str) -> str | None:
    """Id of the node feeding ``node_id``'s input ``input_name`` (None when that input is not linked)."""
    value = workflow[node_id]["inputs"].get(input_name)
    return value[0] if _is_link(value) else None


def _the_sampler(workflow: dict) -> tuple[str, str]:
    """(node, input name) the ``which`` prompt is wired to: our sampler's, or a native guider's."""
    samplers = nodes_of_type(workflow, SAMPLER)
    if samplers:
        return samplers[0], ""
    for native in nodes_of_type(workflow, NATIVE_SAMPLER):
        guider = linked_node(workflow, native, "guider")
        if guider is not None and workflow[guider]["class_type"] in GUIDER_INPUTS:
            return guider, workflow[guider]["class_type"]
    raise ComfyError(f"the workflow has no {' or '.join(SAMPLER)} node (nor a native sampler with a guider)")


def set_prompt(workflow: dict, text: str, which: str = "positive") -> str:
    """Set the text of the text-encode node wired to the sampler's ``positive`` (or ``negative``) input (with
    native sampling: the guider's, through the conversion and ReferenceLatent nodes on the way)."""
    sampler, guider = _the_sampler(workflow)
    name = GUIDER_INPUTS[guider].get(which) if guider else which
    node = linked_node(workflow, sampler, name) if name else None
    while node is not None and workflow[node]["class_type"] in CONDITIONING_PASSTHROUGH:
        node = linked_node(workflow, node, "conditioning")
    if node is None:
        raise ComfyError(f"the sampler's {which!r} input is not connected in this workflow")
    if workflow[node]["class_type"] not in TEXT_ENCODE:
        raise ComfyError(f"the sampler's {which!r} input comes from a {workflow[node]['class_type']}")
    workflow[node]["inputs"]["text"] = text
    return node


def set_seed(workflow: dict, seed: int) -> list[str]:
    """Set the seed of every sampler (ours, native KSampler) and native noise node."""
    nodes = nodes_of_type(workflow, (*SAMPLER, KSAMPLER))
    for node in nodes:
        workflow[node]["inputs"]["seed"] = int(seed)
    for node in nodes_of_type(workflow, NATIVE_NOISE):
        workflow[node]["inputs"]["noise_seed"] = int(seed)
    return sorted(nodes + nodes_of_type(workflow, NATIVE_NOISE), key=_id_key)


def set_images(workflow: dict, names: list[str]) -> list[str]:
    """Put uploaded image names into the LoadImage nodes (id order) and drop the references left without one.

    A dropped reference is cut out of the ``references`` chain: whatever fed it is wired to what it fed.
    When no reference is left and the sampler's width/height are 0 ("size of the first reference"), they
    become 1024.
    Returns the ids of the LoadImage nodes that received an image.
    """
    loaders = nodes_of_type(workflow, LOAD_IMAGE)
    if len(names) > len(loaders):
        raise ComfyError(
            f"{len(names)} image(s) given but the workflow has only {len(loaders)} LoadImage node(s); "
            "use a workflow with more references"
        )
    for node, name in zip(loaders, names):
        workflow[node]["inputs"]["image"] = name
    for node in loaders[len(names) :]:
        _remove_image(workflow, node)
    if not names:
        for sampler in nodes_of_type(workflow, SAMPLER):
            inputs = workflow[sampler]["inputs"]
            if "references" not in inputs:
                for key in ("width", "height"):
                    if inputs.get(key) == 0:
                        inputs[key] = 1024
    return loaders[: len(names)]


def _remove_image(workflow: dict, image_node: str) -> None:
    for enc in [i for i, n in workflow.items() if _feeds(n, image_node)]:
        if workflow[enc]["class_type"] != REFERENCE_ENCODE:
            raise ComfyError(f"LoadImage {image_node} feeds a {workflow[enc]['class_type']}; cannot drop it")
        upstream = workflow[enc]["inputs"].get("references")  # a link, or None
        for node in workflow.values():
            for key, value in list(node["inputs"].items()):
                if _is_link(value) and value[0] == enc:
                    if upstream is None:
                        del node["inputs"][key]  # `references` is optional everywhere
                    else:
                        node["inputs"][key] = list(upstream)
        del workflow[enc]
    del workflow[image_node]


def _feeds(node: dict, source: str) -> bool:
    return any(_is_link(v) and v[0] == source for v in node["inputs"].values())


def parse_value(text: str):
    """A ``--set`` value: JSON when it parses (numbers, true/false, null, lists), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_set(workflow: dict, assignment: str) -> str:
    """Apply one ``NODE.INPUT=VALUE``; NODE is a node id, a class_type (must be unique) or a node title."""
    target, sep, raw = assignment.partition("=")
    node_ref, dot, input_name = target.rpartition(".")
    if not sep or not dot or not node_ref or not input_name:
        raise ComfyError(f"--set {assignment!r}: expected NODE.INPUT=VALUE")
    if node_ref in workflow:
        matches = [node_ref]
    else:
        matches = [i for i, n in workflow.items() if n["class_type"] == node_ref]
        if not matches:
            matches = [i for i, n in workflow.items() if n.get("_meta", {}).get("title") == node_ref]
    if not matches:
        raise ComfyError(f"--set {assignment!r}: no node with id, type or title {node_ref!r}")
    if len(matches) > 1:
        raise ComfyError(
            f"--set {assignment!r}: {node_ref!r} matches nodes {sorted(matches, key=_id_key)}; use an id"
        )
    node = matches[0]
    inputs = workflow[node]["inputs"]
    if _is_link(inputs.get(input_name)):
        raise ComfyError(f"--set {assignment!r}: input {input_name!r} of node {node} is a link, not a value")
    inputs[input_name] = parse_value(raw)
    return node


def prepare_workflow(
    workflow: dict,
    *,
    images: list[str] | None = None,
    prompt: str | None = None,
    negative: str | None = None,
    seed: int | None = None,
    sets: list[str] = (),
) -> dict:
    """A patched copy of ``workflow``. ``images`` are names already on the server (see ``upload_image``);
    ``None`` leaves the LoadImage nodes alone."""
    wf = copy.deepcopy(workflow)
    if images is not None:
        set_images(wf, list(images))
    if prompt is not None:
        set_prompt(wf, prompt, "positive")
    if negative is not None:
        set_prompt(wf, negative, "negative")
    if seed is not None:
        set_seed(wf, seed)
    for s in sets:
        apply_set(wf, s)
    return wf


def format_prompt_error(body: dict) -> str:
    """Readable text for a ``POST /prompt`` 400 answer (``error`` + ``node_errors``)."""
    err = body.get("error") or {}
    if isinstance(err, str):
        err = {"message": err}
    lines = [f"ComfyUI rejected the workflow: {err.get('message', 'invalid prompt')}"]
    if err.get("details"):
        lines.append(f"  {err['details']}")
    for node_id, info in sorted((body.get("node_errors") or {}).items(), key=lambda kv: _id_key(kv[0])):
        for e in info.get("errors", []):
            detail = f" ({e['details']})" if e.get("details") else ""
            lines.append(f"  node {node_id} ({info.get('class_type', '?')}): {e.get('message', '')}{detail}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# HTTP


def _url(server: str, path: str, query: dict | None = None) -> str:
    url = server.rstrip("/") + path
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


def _request(server: str, path: str, *, data: bytes | None = None, headers=None, query=None, timeout=60):
    req = urllib.request.Request(_url(server, path, query), data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as e:
        raise ComfyError(f"cannot reach ComfyUI at {server}: {getattr(e, 'reason', e)}") from e


def _get_json(server: str, path: str, **kw):
    try:
        return json.loads(_request(server, path, **kw))
    except urllib.error.HTTPError as e:
        raise ComfyError(f"GET {path}: HTTP {e.code} {e.read()[:500]!r}") from e


def upload_image(server: str, path: str | Path, *, subfolder: str = "", overwrite: bool = True) -> str:
    """Upload a local image to the server's input folder; returns the name to put in a LoadImage node."""
    path = Path(path)
    boundary = uuid.uuid4().hex
    ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    fields = {"overwrite": "true" if overwrite else "false", "type": "input", "subfolder": subfolder}
    body = b""
    for key, value in fields.items():
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode()
    body += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{path.name}"\r\n'
        f"Content-Type: {ctype}\r\n\r\n"
    ).encode()
    body += path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    try:
        answer = json.loads(_request(server, "/upload/image", data=body, headers=headers))
    except urllib.error.HTTPError as e:
        raise ComfyError(f"uploading {path}: HTTP {e.code}") from e
    return f"{answer['subfolder']}/{answer['name']}" if answer.get("subfolder") else answer["name"]


def queue(server: str, workflow: dict, client_id: str, prompt_id: str | None = None) -> str:
    """``POST /prompt``; returns the prompt id. Raises ``PromptRejected`` (with node_errors) on HTTP 400."""
    payload = {"prompt": workflow, "client_id": client_id}
    if prompt_id:
        payload["prompt_id"] = prompt_id
    data = json.dumps(payload).encode()
    try:
        answer = json.loads(
            _request(server, "/prompt", data=data, headers={"Content-Type": "application/json"})
        )
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            body = json.loads(raw)
        except ValueError:
            raise ComfyError(f"POST /prompt: HTTP {e.code}: {raw[:500]!r}") from e
        raise PromptRejected(body) from e
    return answer["prompt_id"]


def connect_ws(server: str, client_id: str, timeout: float = 5.0):
    """Open ``/ws?clientId=`` (before queueing, so no message is missed); None without websocket-client."""
    if websocket is None:
        return None
    parts = urllib.parse.urlsplit(server)
    scheme = "wss" if parts.scheme == "https" else "ws"
    url = urllib.parse.urlunsplit(
        (scheme, parts.netloc, parts.path.rstrip("/") + "/ws", f"clientId={client_id}", "")
    )
    try:
        return websocket.create_connection(url, timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure: fall back to polling
        return None


def get_history(server: str, prompt_id: str) -> dict | None:
    """The history entry of one prompt, or None while it has not finished."""
    return _get_json(server, f"/history/{prompt_id}").get(prompt_id)


def _check_history(entry: dict) -> dict:
    status = entry.get("status") or {}
    if status.get("status_str") == "error":
        for kind, data in status.get("messages", []):
            if kind == "execution_error":
                raise ExecutionFailed(data)
            if kind == "execution_interrupted":
                raise Interrupted(f"the run was interrupted at node {data.get('node_id')}")
        raise ComfyError("the run failed (no error message in /history)")
    return entry


def print_progress(event: str, data: dict) -> None:
    """Default progress callback: one line per node, a progress bar for steps (on stderr)."""
    if event == "progress":
        done, total = data.get("value", 0), data.get("max", 1) or 1
        bar = "#" * int(30 * done / total)
        end = "\n" if done >= total else ""
        print(
            f"\r  node {data.get('node')}: [{bar:<30}] {done}/{total}", end=end, file=sys.stderr, flush=True
        )
    elif event == "executing" and data.get("node") is not None:
        print(f"running node {data['node']}", file=sys.stderr, flush=True)
    elif event == "executed" and (data.get("output") or {}).get("images"):
        print(
            f"node {data.get('node')} saved {len(data['output']['images'])} image(s)",
            file=sys.stderr,
            flush=True,
        )
    elif event == "execution_cached" and data.get("nodes"):
        print(f"cached: nodes {', '.join(map(str, data['nodes']))}", file=sys.stderr, flush=True)


def wait(
    server: str,
    prompt_id: str,
    ws=None,
    *,
    timeout: float = 3600.0,
    poll_interval: float = 1.0,
    on_event=None,
) -> dict:
    """Wait for a queued prompt to finish and return its ``/history`` entry.

    With ``ws`` (see ``connect_ws``) the websocket messages ``progress``, ``executing``, ``executed``,
    ``execution_error`` and ``execution_interrupted`` of this prompt are passed to ``on_event(type, data)``;
    ``/history`` is still checked every few seconds, so a lost message cannot hang the wait. Without ``ws`` it
    polls ``/history``. Raises ``ExecutionFailed``, ``Interrupted`` or ``TimedOut``.
    """
    deadline = time.monotonic() + timeout
    next_poll = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_poll:
            entry = get_history(server, prompt_id)
            if entry is not None and (entry.get("status") or {}).get("completed") is not None:
                return _check_history(entry)
            if entry is not None and entry.get("outputs") and not entry.get("status"):
                return entry
            next_poll = time.monotonic() + (5.0 if ws is not None else poll_interval)
        if ws is None:
            time.sleep(max(0.0, min(next_poll, deadline) - time.monotonic()))
            continue
        try:
            message = ws.recv()
        except Exception as e:  # noqa: BLE001
            if not _is_ws_timeout(e):
                ws = None  # connection lost: keep going by polling
            continue
        if not isinstance(message, str):
            continue  # binary frames are previews
        event = json.loads(message)
        kind, data = event.get("type"), event.get("data") or {}
        if data.get("prompt_id") != prompt_id:
            continue
        if on_event:
            on_event(kind, data)
        if kind == "execution_error":
            raise ExecutionFailed(data)
        if kind == "execution_interrupted":
            raise Interrupted(f"the run was interrupted at node {data.get('node_id')}")
        if kind == "execution_success" or (kind == "executing" and data.get("node") is None):
            next_poll = 0.0  # finished: read the history now
    raise TimedOut(f"prompt {prompt_id} did not finish within {timeout:.0f} s")


def _is_ws_timeout(e: Exception) -> bool:
    if isinstance(e, TimeoutError):
        return True
    return websocket is not None and isinstance(e, websocket.WebSocketTimeoutException)


def fetch_outputs(history_entry: dict, kinds: tuple[str, ...] = ("output",)) -> list[dict]:
    """The images a finished prompt saved: ``[{node_id, filename, subfolder, type}]`` in node-id order."""
    images = []
    for node_id, output in sorted(
        (history_entry.get("outputs") or {}).items(), key=lambda kv: _id_key(kv[0])
    ):
        for image in output.get("images", []):
            if image.get("type", "output") in kinds:
                images.append({"node_id": node_id, **image})
    return images


def download_image(server: str, image: dict) -> bytes:
    """The bytes of one output image (``GET /view``)."""
    query = {
        "filename": image["filename"],
        "subfolder": image.get("subfolder", ""),
        "type": image.get("type", "output"),
    }
    try:
        return _request(server, "/view", query=query)
    except urllib.error.HTTPError as e:
        raise ComfyError(f"downloading {image['filename']}: HTTP {e.code}") from e


def save_outputs(server: str, images: list[dict], output_dir: str | Path) -> list[Path]:
    """Download ``images`` (from ``fetch_outputs``) into ``output_dir``; returns the written paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for image in images:
        path = output_dir / Path(image["filename"]).name
        path.write_bytes(download_image(server, image))
        paths.append(path)
    return paths


def run(
    server: str,
    workflow: dict,
    *,
    images: list[str | Path] = (),
    prompt: str | None = None,
    negative: str | None = None,
    seed: int | None = None,
    sets: list[str] = (),
    output_dir: str | Path | None = None,
    timeout: float = 3600.0,
    on_event=None,
) -> tuple[dict, list[Path]]:
    """Upload, patch, queue, wait and download in one call. Returns (history entry, saved paths)."""
    names = [upload_image(server, p) for p in images]
    wf = prepare_workflow(
        workflow, images=names if images else None, prompt=prompt, negative=negative, seed=seed, sets=sets
    )
    client_id = uuid.uuid4().hex
    ws = connect_ws(server, client_id)
    try:
        prompt_id = queue(server, wf, client_id, prompt_id=str(uuid.uuid4()))
        entry = wait(server, prompt_id, ws, timeout=timeout, on_event=on_event)
    finally:
        if ws is not None:
            ws.close()
    paths = save_outputs(server, fetch_outputs(entry), output_dir) if output_dir is not None else []
    return entry, paths


# ----------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Queue a FLUX.2 [klein] API workflow on a ComfyUI server and save the images.",
        epilog="Exit codes: 0 ok, 1 server/argument error, 3 workflow rejected, 4 node failed, "
        "5 interrupted, 6 timeout.",
    )
    parser.add_argument(
        "--server", default="http://127.0.0.1:8188", help="ComfyUI address (default %(default)s)"
    )
    parser.add_argument("--workflow", required=True, help="API-format workflow, e.g. workflows/api/...json")
    parser.add_argument("--prompt", help="text for the positive prompt")
    parser.add_argument("--negative", help="text for the negative prompt (base-model workflows)")
    parser.add_argument("--seed", type=int, help="sampler seed (default: the workflow's)")
    parser.add_argument(
        "--image", action="append", default=[], metavar="PATH", help="reference image; repeat, in order"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NODE.INPUT=VALUE",
        help="set any input; NODE is an id, class_type or title; VALUE is JSON or text (repeatable)",
    )
    parser.add_argument("--output-dir", default="out", help="where to save the images (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (default %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        workflow = load_workflow(args.workflow)
        for p in args.image:
            if not Path(p).is_file():
                raise ComfyError(f"no such image: {p}")
        entry, paths = run(
            args.server,
            workflow,
            images=args.image,
            prompt=args.prompt,
            negative=args.negative,
            seed=args.seed,
            sets=args.set,
            output_dir=args.output_dir,
            timeout=args.timeout,
            on_event=None if args.quiet else print_progress,
        )
    except ComfyError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if not paths:
        print("error: the workflow finished but saved no images", file=sys.stderr)
        return 4
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
