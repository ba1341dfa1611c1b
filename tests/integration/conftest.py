"""A real ComfyUI server with this pack installed, on tiny random weights, for the integration tests.

Set ``COMFYUI_PATH`` to a ComfyUI checkout (0.29 or later: native FLUX.2 [klein] support is used for the
parity tests) to run them; optionally ``COMFYUI_PYTHON`` to the Python that runs it (default: this one).
Without ``COMFYUI_PATH`` every test here is skipped.

One server is started per session, on the CPU, in a temporary base folder:

- ``custom_nodes/comfyui-flux2-klein`` -> this repository, and ``custom_nodes/flux2_klein_test_nodes`` ->
  ``tests/integration/test_nodes_pack`` (a test-only node that turns our conditioning into native
  CONDITIONING);
- ``models/`` holds tiny random weights under the official file names the bundled API workflows use, so they
  run unchanged. The DiTs have head size 128 (hidden 256 = 2 heads) and 1 + 1 blocks, so native ComfyUI,
  which derives the head count as hidden // 128, loads the very same files. The "4B" pair is 32 wide
  (Qwen3 hidden 32, DiT text input 96), the "9B" pair 48 wide (144), so a wrong pairing is detectable. The
  VAE has the full-width encoder native ComfyUI requires (128, mult 1-2-4-4, 2 res blocks) and a 32-wide
  decoder, which native reads from the weights and which keeps decoding fast;
- ``not-a-dit.safetensors`` in diffusion_models is a copy of the VAE (for the error tests);
- FLUX.1 Fill [dev] under the names its bundled workflows use (``flux1-fill-dev.safetensors``,
  ``t5xxl_fp16.safetensors``, ``clip_l.safetensors``, ``ae.safetensors``): ``tiny_flux1.py``'s tiny DiT
  (hidden 256 = 2 heads of 128, 1 + 1 blocks, 384 input channels) reading the tiny T5's 32-wide and CLIP's
  64-wide outputs, and its 32-wide FLUX.1 VAE. These workflows run only our nodes, which read every width
  from the weights; native ComfyUI would need a Fill DiT with the real 4096 / 768 text widths (its CLIP-L and
  T5-XXL are fixed-size models), which ``test_fill_server.py`` writes for its own parity test. The
  tokenizers are ComfyUI's own (``comfy/sd1_tokenizer``, ``comfy/text_encoders/t5_tokenizer``, found by the
  nodes through ``host.tokenizer_folders()``), whose ids fit the tiny encoders' real vocabulary sizes;
- FLUX.2 [dev] under its official names: ``flux2-dev.safetensors``, a tiny DiT of the klein rig's widths with
  the guidance embedder (hidden 256, 48-wide text = 3 x the tiny Mistral's 16) and 2 + 2 blocks, so that a
  split across two devices puts blocks on both (the parts outside the blocks outweigh one block), and
  ``mistral_3_small_flux2_bf16.safetensors``, ``tiny_mistral.py``'s Mistral3 language model written as
  ComfyUI's file (``model.`` names, the first 30 layers, no final norm or lm_head, no config.json, so Mistral
  Small's head size 128) with its Tekken tokenizer inside as the ``tekken_model`` tensor, as ComfyUI's
  own files carry it (a v7 tekken.json: mistral-common's vocabulary and the explicit control-token list);
- input/, output/, user/ and temp/ are the server's folders (nothing is written into the ComfyUI checkout).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TEST_PACK = HERE / "test_nodes_pack"
PACK_LINK = "comfyui-flux2-klein"
TEST_PACK_LINK = "flux2_klein_test_nodes"

SKIP_REASON = (
    "COMFYUI_PATH is not set: the integration tests need a real ComfyUI checkout (0.29+), e.g. "
    "COMFYUI_PATH=/path/to/ComfyUI python -m pytest tests/integration"
)
STARTUP_TIMEOUT = 90.0

# Text widths: the tiny "Qwen3-4B" is E4 wide (DiT text input 3 * E4), the tiny "Qwen3-8B" E8 wide.
E4, E8 = 32, 48
DIT_SHAPE = dict(
    in_channels=128,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=128,  # native ComfyUI: num_heads = hidden // 128
    num_attention_heads=2,
    axes_dims_rope=(32, 32, 32, 32),
    guidance_embeds=False,
)

# file name -> seed and text width, under the official names the bundled workflows use
DIT_FILES = {
    "flux-2-klein-4b.safetensors": dict(seed=101, joint_attention_dim=3 * E4),
    "flux-2-klein-base-4b.safetensors": dict(seed=102, joint_attention_dim=3 * E4),
    "flux-2-klein-9b-kv.safetensors": dict(seed=103, joint_attention_dim=3 * E8),
}
TEXT_FILES = {
    "qwen_3_4b.safetensors": dict(seed=201, hidden_size=E4, intermediate_size=64),
    "qwen_3_8b.safetensors": dict(
        seed=202, hidden_size=E8, intermediate_size=96, num_attention_heads=6, num_key_value_heads=2
    ),
}
# Quantised releases of flux-2-klein-4b.safetensors (same weights): format, marker form, options.
QUANTISED_DITS = {
    "flux-2-klein-4b-fp8.safetensors": ("float8_e4m3fn", "tensor", {}),
    "flux-2-klein-4b-nvfp4.safetensors": ("nvfp4", "header", {"prefix": "model.diffusion_model."}),
    "flux-2-klein-4b-int8-convrot.safetensors": ("int8_tensorwise", "tensor", {"convrot": 256}),
}
GGUF_DIT = "flux-2-klein-4b-Q8_0.gguf"  # in the legacy models/unet folder
LORA_FILE = "flux-2-klein-4b-lora.safetensors"  # the name the bundled LoRA workflow uses
ATTENTION_BOOST = 3.0  # see sharpen_attention
VAE_FILE = "flux2-vae.safetensors"
NOT_A_DIT = "not-a-dit.safetensors"
# FLUX.1 Fill [dev] and FLUX.2 [dev] under the names of their bundled workflows
FILL_FILES = dict(dit="flux1-fill-dev.safetensors", t5="t5xxl_fp16.safetensors", clip="clip_l.safetensors",
                  vae="ae.safetensors")  # fmt: skip
DEV_DIT, DEV_TEXT_ENCODER = "flux2-dev.safetensors", "mistral_3_small_flux2_bf16.safetensors"
MILLION_BLOCKS = "corrupt-million-blocks.safetensors"  # one tensor claiming block 1000000

# Reference images (width, height) written to disk and uploaded by the tests.
REFERENCE_SIZES = [(96, 64), (64, 80), (80, 80), (112, 80), (64, 64)]
MASKED = ("masked", 96, 64)  # a reference-style picture whose transparent box is Load Image's MASK


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.comfyui)
            if not os.environ.get("COMFYUI_PATH"):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def load_client_module():
    """scripts/klein_client.py, imported by path (it is a script, not part of a package)."""
    if "klein_client" in sys.modules:
        return sys.modules["klein_client"]
    spec = importlib.util.spec_from_file_location("klein_client", REPO / "scripts" / "klein_client.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["klein_client"] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------------------
# Weights and images


def sharpen_attention(dit, factor: float = ATTENTION_BOOST):
    """Scale the q/k RMSNorm weights and the attention output projections of a tiny random DiT.

    With plain random weights the attention logits are small, so every token attends almost uniformly to all
    ~600 (mostly text padding) tokens, and the text and the references move the predicted velocity by only ~2%
    and ~0.5%: a comparison of whole images would barely check those paths. Scaled by 3, the prompt changes
    the result by about half of its size and a reference by about 15%.
    """
    import torch

    with torch.no_grad():
        for name, p in dit.named_parameters():
            if any(part in name for part in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")):
                p.mul_(factor)
            elif any(part in name for part in ("attn.to_out", "attn.to_add_out")):
                p.mul_(factor)
    return dit


def write_models(models: Path) -> dict[str, Path]:
    """Tiny random weights under the official names; returns {file name: path}."""
    import torch
    from safetensors.torch import load_file, save_file
    from tiny_dit import make_diffusers_dit
    from tiny_dit import write_bfl_file as write_dit
    from tiny_text import make_tiny_qwen3, write_comfy_file
    from tiny_vae import comfy_layout, random_vae_state_dict
    from tiny_vae import write_bfl_file as write_vae

    from flux2_core.vae.autoencoder import VAEConfig

    paths = {}
    for name, spec in DIT_FILES.items():
        spec = dict(spec)
        dit = sharpen_attention(make_diffusers_dit(spec.pop("seed"), **DIT_SHAPE, **spec))
        paths[name] = write_dit(dit, models / "diffusion_models" / name)
        if name == "flux-2-klein-4b.safetensors":
            _write_quantised_dits(dit, models / "diffusion_models", paths)
    for name, spec in TEXT_FILES.items():
        spec = dict(spec)
        qwen = make_tiny_qwen3(spec.pop("seed"), **spec)
        paths[name] = write_comfy_file(qwen, models / "text_encoders" / name, lm_head=False)
    # Native ComfyUI builds the encoder at full width whatever the file holds and reads the decoder width
    # from decoder.conv_in; the ComfyUI layout has the quant convs at top level, as in flux2-vae.safetensors.
    vae_config = VAEConfig(ch=128, ch_mult=(1, 2, 4, 4), num_res_blocks=2, decoder_ch=32)
    sd = comfy_layout(random_vae_state_dict(vae_config, seed=301))
    sd = {k: v.to(torch.bfloat16) if not k.startswith("bn.") else v for k, v in sd.items()}
    paths[VAE_FILE] = write_vae(sd, models / "vae" / VAE_FILE)
    paths[NOT_A_DIT] = Path(shutil.copyfile(paths[VAE_FILE], models / "diffusion_models" / NOT_A_DIT))
    hostile = load_file(
        str(paths["flux-2-klein-4b.safetensors"])
    )  # a good model plus one tensor of block 10^6
    hostile["double_blocks.1000000.img_attn.qkv.weight"] = torch.zeros(3, 1)
    paths[MILLION_BLOCKS] = models / "diffusion_models" / MILLION_BLOCKS
    save_file(hostile, str(paths[MILLION_BLOCKS]))
    _write_fill_files(models, paths)
    _write_dev_files(models, paths)
    return paths


def _write_fill_files(models: Path, paths: dict[str, Path]) -> None:
    from tiny_flux1 import (
        make_tiny_clip,
        make_tiny_t5,
        write_clip_file,
        write_fill_dit,
        write_flux1_vae,
        write_t5_file,
    )

    f = FILL_FILES
    paths[f["dit"]] = write_fill_dit(models / "diffusion_models" / f["dit"], seed=501)
    paths[f["t5"]] = write_t5_file(make_tiny_t5(seed=502), models / "text_encoders" / f["t5"])
    paths[f["clip"]] = write_clip_file(make_tiny_clip(seed=503), models / "text_encoders" / f["clip"])
    paths[f["vae"]] = write_flux1_vae(models / "vae" / f["vae"], seed=504)


def _write_dev_files(models: Path, paths: dict[str, Path]) -> None:
    from tiny_dit import make_diffusers_dit
    from tiny_dit import write_bfl_file as write_dit
    from tiny_mistral import TINY_TEXT, TINY_TEXT_HEAD_128, make_tiny_mistral3, v7_tekken_json
    from tiny_mistral import write_comfy_file as write_mistral

    shape = {**DIT_SHAPE, "num_layers": 2, "num_single_layers": 2, "guidance_embeds": True,
             "joint_attention_dim": 3 * TINY_TEXT["hidden_size"]}  # fmt: skip
    dit = sharpen_attention(make_diffusers_dit(701, **shape))
    paths[DEV_DIT] = write_dit(dit, models / "diffusion_models" / DEV_DIT)
    heads = {k: TINY_TEXT_HEAD_128[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
    mistral = make_tiny_mistral3(seed=702, **heads)
    paths[DEV_TEXT_ENCODER] = write_mistral(
        mistral, models / "text_encoders" / DEV_TEXT_ENCODER, v7_tekken_json(), layers=30, lm_head=False
    )


def _write_quantised_dits(dit, folder: Path, paths: dict[str, Path]) -> None:
    from quant_files import quantised_layers, write_gguf, write_quantised
    from tiny_dit import bfl_state_dict

    sd = bfl_state_dict(dit)
    for name, (fmt, form, options) in QUANTISED_DITS.items():
        options = dict(options)
        write_quantised(sd, folder / name, fmt, form, prefix=options.pop("prefix", ""), **options)
        paths[name] = folder / name
    quantised = {layer + ".weight" for layer in quantised_layers(sd)}
    unet = folder.parent / "unet"
    unet.mkdir(exist_ok=True)
    write_gguf(sd, unet / GGUF_DIT, "flux", {k: "Q8_0" for k in quantised})
    paths[GGUF_DIT] = unet / GGUF_DIT
    write_lora(sd, folder.parent / "loras" / LORA_FILE)
    paths[LORA_FILE] = folder.parent / "loras" / LORA_FILE


def write_lora(sd: dict, path: Path) -> None:
    """A kohya-layout LoRA (with alpha) on the attention and MLP of every block of the 4B model."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(401)
    tensors = {}
    for key, weight in sd.items():
        if ("_attn.qkv" in key or "_mlp.0" in key or ".linear1" in key) and key.endswith(".weight"):
            name = "lora_unet_" + key[: -len(".weight")].replace(".", "_")
            tensors[name + ".lora_down.weight"] = torch.randn(4, weight.shape[1], generator=g) * 0.5
            tensors[name + ".lora_up.weight"] = torch.randn(weight.shape[0], 4, generator=g) * 0.5
            tensors[name + ".alpha"] = torch.tensor(4.0)
    save_file(tensors, str(path))


def reference_png(width: int, height: int, seed: int = 0) -> bytes:
    """A deterministic RGB test picture: smooth gradients, a disc and some noise (PNG bytes)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed + 1000 * width + height)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 255 * x / max(width - 1, 1)
    g = 255 * y / max(height - 1, 1)
    b = 255 * ((x - width / 2) ** 2 + (y - height / 2) ** 2 < (min(width, height) / 3) ** 2)
    pixels = np.stack([r, g, b], -1) + rng.normal(0, 12, (height, width, 3))
    buffer = BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def masked_png(width: int, height: int) -> bytes:
    """The test picture with alpha 0 in a box in its middle: ComfyUI's Load Image gives that box as MASK 1."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(BytesIO(reference_png(width, height))).convert("RGB"))
    alpha = np.full((height, width), 255, dtype=np.uint8)
    alpha[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = 0
    buffer = BytesIO()
    Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA").save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------------------
# The client the tests get


@dataclass
class ComfyServer:
    """A running ComfyUI plus thin helpers over scripts/klein_client.py."""

    url: str
    base: Path
    log_path: Path
    models: dict[str, Path]
    references: dict[tuple[int, int], Path]
    kc: object  # the klein_client module
    _object_info: dict | None = field(default=None, repr=False)

    # --- plain HTTP
    def get_json(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=60) as resp:
            return json.loads(resp.read())

    def post_json(self, path: str, body: dict) -> tuple[int, object]:
        """POST a JSON body; returns (HTTP status, parsed JSON or text) without raising on 4xx/5xx."""
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def object_info(self) -> dict:
        if self._object_info is None:
            self._object_info = self.get_json("/object_info")
        return self._object_info

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    # --- the client's workflow helpers
    def api_workflow(self, name: str) -> dict:
        return self.kc.load_workflow(REPO / "workflows" / "api" / f"{name}.json")

    def upload(self, size: tuple) -> str:
        """Upload a reference picture by its (width, height), or MASKED."""
        return self.kc.upload_image(self.url, self.references[size])

    def submit(self, workflow: dict) -> tuple[int, object]:
        """POST /prompt without raising: (status, body)."""
        return self.post_json("/prompt", {"prompt": workflow, "client_id": uuid.uuid4().hex})

    def run(self, workflow: dict, timeout: float = 300.0, on_event=None) -> dict:
        """Queue and wait (websocket + /history); the finished /history entry. Raises the client's errors."""
        client_id = uuid.uuid4().hex
        ws = self.kc.connect_ws(self.url, client_id)
        try:
            prompt_id = self.kc.queue(self.url, workflow, client_id, prompt_id=str(uuid.uuid4()))
            return self.kc.wait(self.url, prompt_id, ws, timeout=timeout, on_event=on_event)
        finally:
            if ws is not None:
                ws.close()

    def finished_history(self, prompt_id: str, timeout: float = 30.0) -> dict:
        """The /history entry of a prompt once it has a status (the websocket can report the end of a run
        slightly before the server stores its history)."""
        deadline = time.monotonic() + timeout
        while True:
            entry = self.kc.get_history(self.url, prompt_id)
            if entry is not None and entry.get("status"):
                return entry
            assert time.monotonic() < deadline, f"no history for prompt {prompt_id} after {timeout:.0f} s"
            time.sleep(0.2)

    def images(self, entry: dict) -> dict[str, object]:
        """{SaveImage node id: PIL image} of a finished run (one image per node expected)."""
        from PIL import Image

        out = {}
        for image in self.kc.fetch_outputs(entry):
            assert image["node_id"] not in out, f"node {image['node_id']} saved several images"
            out[image["node_id"]] = Image.open(BytesIO(self.kc.download_image(self.url, image)))
            out[image["node_id"]].load()
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for_server(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"ComfyUI exited with code {process.returncode} while starting:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/object_info", timeout=10) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(f"ComfyUI did not serve /object_info within {STARTUP_TIMEOUT:.0f} s:\n{_tail(log_path)}")


def _check_import_log(log: str) -> None:
    """Fail loudly when ComfyUI could not import our pack (it only logs it and carries on)."""
    bad = [
        line
        for line in log.splitlines()
        if ("IMPORT FAILED" in line or "Cannot import" in line)
        and (PACK_LINK in line or TEST_PACK_LINK in line)
    ]
    if bad:
        pytest.fail("ComfyUI failed to import a node pack:\n" + "\n".join(bad) + "\n\nserver log:\n" + log)


@pytest.fixture(scope="session")
def comfy(tmp_path_factory) -> ComfyServer:
    yield from _serve(tmp_path_factory, with_models=True)


@pytest.fixture(scope="module")
def empty_comfy(tmp_path_factory) -> ComfyServer:
    """A second server whose model folders are empty, as on a newcomer's first start."""
    yield from _serve(tmp_path_factory, with_models=False)


def _serve(tmp_path_factory, with_models: bool):
    comfyui_path = os.environ.get("COMFYUI_PATH")
    if not comfyui_path:
        pytest.skip(SKIP_REASON)
    main_py = Path(comfyui_path).resolve() / "main.py"
    if not main_py.is_file():
        pytest.fail(f"COMFYUI_PATH={comfyui_path} has no main.py: point it at a ComfyUI checkout")

    base = tmp_path_factory.mktemp("comfyui_base")
    for sub in (
        "models/diffusion_models",
        "models/unet",
        "models/text_encoders",
        "models/vae",
        "models/loras",
    ):
        (base / sub).mkdir(parents=True)
    for sub in ("custom_nodes", "input", "output", "user", "temp", "references"):
        (base / sub).mkdir()
    (base / "custom_nodes" / PACK_LINK).symlink_to(REPO, target_is_directory=True)
    (base / "custom_nodes" / TEST_PACK_LINK).symlink_to(TEST_PACK, target_is_directory=True)
    models = write_models(base / "models") if with_models else {}
    references = {}
    for width, height in REFERENCE_SIZES:
        path = base / "references" / f"reference_{width}x{height}.png"
        path.write_bytes(reference_png(width, height))
        references[(width, height)] = path
    references[MASKED] = base / "references" / "masked_96x64.png"
    references[MASKED].write_bytes(masked_png(96, 64))

    config = base / "extra_model_paths.yaml"
    config.write_text(
        "flux2_klein_integration:\n"
        f"    base_path: {base}/\n"
        "    is_default: true\n"
        "    diffusion_models: models/diffusion_models/\n"
        "    unet: models/unet/\n"
        "    text_encoders: models/text_encoders/\n"
        "    vae: models/vae/\n"
        "    loras: models/loras/\n"
        "    custom_nodes: custom_nodes/\n",
        encoding="utf-8",
    )
    port = _free_port()
    command = [
        os.environ.get("COMFYUI_PYTHON") or sys.executable,
        str(main_py),
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-api-nodes",
        "--database-url",
        "sqlite:///:memory:",
        "--extra-model-paths-config",
        str(config),
        "--input-directory",
        str(base / "input"),
        "--output-directory",
        str(base / "output"),
        "--user-directory",
        str(base / "user"),
        "--temp-directory",
        str(base / "temp"),
    ]
    log_path = base / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log_file:
        # cwd=base: ComfyUI writes comfyui_detail.log into its working directory
        process = subprocess.Popen(
            command, cwd=base, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(url, process, log_path)
        _check_import_log(log_path.read_text(encoding="utf-8", errors="replace"))
        yield ComfyServer(url, base, log_path, models, references, load_client_module())
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
