"""Hugging Face Hub ids wherever a path is taken: ``org/repo``, ``org/repo@revision``, ``org/repo/file``.

A repo id resolves through ``huggingface_hub``: its cache (``HF_HUB_CACHE`` / ``HF_HOME``), its progress bars,
``HF_TOKEN`` for gated repos and ``HF_HUB_OFFLINE``. Only the files a run needs are fetched: the one named
file, or a diffusers repository's ``model_index.json`` plus the component's folder (``transformer/``,
``text_encoder/`` with ``tokenizer/``, ``vae/``), weights as safetensors only. Files already in the cache are
used without asking the network; anything to download is announced first with its size and destination.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import Flux2Error

log = logging.getLogger(__name__)

DEFAULT_MODEL = "black-forest-labs/FLUX.2-klein-4B"  # Apache-2.0: the newcomer's default
# The official repo whose text encoder and VAE pair with a DiT of this text width (the 4B/9B pairing rule).
PAIRED_REPOS = {
    7680: "black-forest-labs/FLUX.2-klein-4B",
    12288: "black-forest-labs/FLUX.2-klein-9B",
    15360: "black-forest-labs/FLUX.2-dev",  # Mistral Small 3.2 (gated, FLUX.2 [dev] non-commercial licence)
}
COMPONENT_FILES = {
    "transformer": ("transformer/*.safetensors", "transformer/*.json"),
    "text_encoder": ("text_encoder/*.safetensors", "text_encoder/*.json", "tokenizer/*"),
    "vae": ("vae/*.safetensors", "vae/*.json"),
}
_HUB_ID = re.compile(
    r"^(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<revision>refs/pr/\d+|[\w.-]+))?(?:/(?P<file>[^@]+))?$"
)


class MissingComponent(Flux2Error):
    """A repo that has no folder for the component asked for (a single-file repo, say)."""


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse(text: str | Path) -> HubRef | None:
    """The hub reference ``text`` spells, or None when it is (or looks like) a local path."""
    text = str(text)
    if Path(text).expanduser().exists() or text.startswith((".", "/", "~")) or "\\" in text:
        return None
    match = _HUB_ID.match(text)
    if match is None:
        return None
    return HubRef(match["repo"], match["revision"], match["file"])


def local_path(path: str | Path, component: str) -> Path:
    """``path`` itself, or the cached copy of the hub file or repository it names (downloaded if needed)."""
    ref = parse(path)
    if ref is None:
        return Path(path).expanduser()
    if ref.filename:
        return _file(ref)
    return _repository(ref, component)


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> str:
    """huggingface_hub's cache folder, resolved as it resolves it (read at each call, not at import)."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return os.path.expanduser(env[name])
    xdg = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    home = env.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _file(ref: HubRef) -> Path:
    # only a Hub id needs the client
    from huggingface_hub import hf_hub_download

    kwargs = dict(repo_id=ref.repo_id, filename=ref.filename, revision=ref.revision, cache_dir=cache_dir())
    try:
        return Path(hf_hub_download(**kwargs, local_files_only=True))
    except Exception as e:  # noqa: BLE001  (not cached: any error of the cache look-up means "download")
        if not _is_missing(e):
            raise _hub_error(ref, e) from None
    _refuse_offline(ref, ref.filename)
    _announce(ref, _remote_files(ref, [ref.filename]) or [ref.filename])
    try:
        return Path(hf_hub_download(**kwargs))
    except Exception as e:  # noqa: BLE001  (huggingface_hub and its HTTP client raise many types)
        raise _hub_error(ref, e) from None


def _repository(ref: HubRef, component: str) -> Path:
    # only a Hub id needs the client
    from huggingface_hub import snapshot_download

    patterns = ["model_index.json", *COMPONENT_FILES[component]]
    kwargs = dict(repo_id=ref.repo_id, revision=ref.revision, allow_patterns=patterns, cache_dir=cache_dir())
    try:
        root = Path(snapshot_download(**kwargs, local_files_only=True))
        if _has(root, component):
            return root
    except Exception as e:  # noqa: BLE001
        if not _is_missing(e):
            raise _hub_error(ref, e) from None
    _refuse_offline(ref, f"{component}/")
    files = _remote_files(ref, patterns)
    if not any(name.startswith(f"{component}/") for name in files):
        raise MissingComponent(
            f"{ref} has no {component}/ folder (it is not a diffusers repository): name the file, as "
            f"{ref.repo_id}/<file>.safetensors"
        )
    _announce(ref, files)
    try:
        root = Path(snapshot_download(**kwargs))
    except Exception as e:  # noqa: BLE001
        raise _hub_error(ref, e) from None
    return root


def _has(root: Path, component: str) -> bool:
    """The component's weights are in the cached snapshot, every shard its index names included (a download
    cut short goes online again, and huggingface_hub resumes it)."""
    folder = root / component
    if not (folder.is_dir() and any(folder.glob("*.safetensors"))):
        return False
    for index in folder.glob("*.safetensors.index.json"):
        try:
            names = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            return False
        if not all((folder / name).is_file() for name in names):
            return False
    return True


def _remote_files(ref: HubRef, patterns: list[str]) -> dict[str, int]:
    """{file name: size} of the repo's files that match ``patterns``."""
    # only a Hub id needs the client
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
    except Exception as e:  # noqa: BLE001
        raise _hub_error(ref, e) from None
    return {
        s.rfilename: s.size or 0
        for s in info.siblings or []
        if any(fnmatch.fnmatch(s.rfilename, p) for p in patterns)
    }


def _announce(ref: HubRef, files) -> None:
    sizes = files if isinstance(files, dict) else {}
    total = sum(sizes.values())
    size = f", {total / 1024**3:.2f} GB" if total else ""
    log.info("downloading %d file(s)%s of %s into %s", len(files), size, ref, cache_dir())


def _refuse_offline(ref: HubRef, what: str) -> None:
    if offline():
        raise Flux2Error(
            f"{ref} ({what}) is not in the Hugging Face cache {cache_dir()} and HF_HUB_OFFLINE is set, so it "
            "cannot be downloaded: unset HF_HUB_OFFLINE (with a network), or give a local file or folder"
        )


def _is_missing(error: Exception) -> bool:
    # only a Hub id needs the client
    from huggingface_hub.errors import LocalEntryNotFoundError

    return isinstance(error, (LocalEntryNotFoundError, FileNotFoundError))


def _hub_error(ref: HubRef, error: Exception) -> Flux2Error:
    # only a Hub id needs the client
    from huggingface_hub import errors

    url = f"https://huggingface.co/{ref.repo_id}"
    if isinstance(error, errors.LocalEntryNotFoundError):  # the Hub was not reached (no network, ...)
        return Flux2Error(
            f"could not reach the Hugging Face Hub for {ref} ({error}): check the network connection, or set "
            "HF_HUB_OFFLINE=1 to use what is already in the cache"
        )
    if isinstance(error, errors.GatedRepoError):
        return Flux2Error(f"{ref} is gated: accept its licence at {url} and set HF_TOKEN to a token of yours")
    if isinstance(error, errors.RepositoryNotFoundError):
        return Flux2Error(
            f"{ref} is not a repository on the Hugging Face Hub (or it is private: set HF_TOKEN), nor a "
            "local path: check the name"
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return Flux2Error(f"{ref}: no such revision (branch, tag or commit) at {url}")
    if isinstance(error, errors.RemoteEntryNotFoundError):
        return Flux2Error(f"{ref} has no file {ref.filename}: see the files at {url}/tree/main")
    return Flux2Error(
        f"could not fetch {ref} from the Hugging Face Hub ({type(error).__name__}: {error}): check the "
        "network connection, or set HF_HUB_OFFLINE=1 to use what is already in the cache"
    )
