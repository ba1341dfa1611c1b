"""Hugging Face Hub ids in the command line and the core, against a hub cache laid out as huggingface_hub
lays it out (models--org--name/refs/main -> snapshots/<commit>/...), with tiny models in diffusers layout."""

import json
import logging

import pytest
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file, write_diffusers_folder
from tiny_text import make_tiny_qwen3, write_hf_folder
from tiny_vae import random_vae_state_dict
from tiny_vae import write_diffusers_folder as write_vae_folder

from flux2_core.cli.main import main
from flux2_core.dit.files import load_transformer
from flux2_core.errors import Flux2Error
from flux2_core.weights import hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(cache, repo_id):
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The default repo as a full diffusers klein repository, and a repo with one single file."""
    cache = tmp_path_factory.mktemp("hub")
    root = _snapshot(cache, hub.DEFAULT_MODEL)
    dit = make_diffusers_dit(seed=7, joint_attention_dim=96)
    write_diffusers_folder(dit, root)
    write_vae_folder(random_vae_state_dict(seed=6), root)
    write_hf_folder(make_tiny_qwen3(seed=5), root / "text_encoder")
    index = {"_class_name": "Flux2KleinPipeline", "is_distilled": True}
    (root / "model_index.json").write_text(json.dumps(index))
    single = _snapshot(cache, "someone/klein-single")
    single.mkdir(parents=True)
    write_bfl_file(dit, single / "flux-2-klein-4b.safetensors")
    return cache


@pytest.fixture
def offline(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _generate(tmp_path, *argv):
    out = tmp_path / "fox.png"
    code = main(
        ["generate", "--prompt", "a red fox", "--width", "64", "--height", "64", "--output", str(out), *argv]
    )
    return code, out


def test_no_model_at_all_runs_the_default_klein_4b_from_the_cache(offline, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    code, out = _generate(tmp_path)
    assert code == 0 and Image.open(out).size == (64, 64)
    assert f"text encoder and VAE: from {hub.DEFAULT_MODEL}, the model's own repository" in caplog.text


def test_a_repo_id_with_explicit_text_encoder_and_vae(offline, tmp_path):
    repo = hub.DEFAULT_MODEL
    code, out = _generate(tmp_path, "--model", repo, "--text-encoder", repo, "--vae", f"{repo}@main")
    assert code == 0 and out.exists()


def test_a_single_file_repo_takes_its_companions_from_the_paired_official_repo(
    offline, tmp_path, caplog, monkeypatch
):
    monkeypatch.setitem(hub.PAIRED_REPOS, 96, hub.DEFAULT_MODEL)  # the tiny DiT reads 96-wide text
    caplog.set_level(logging.INFO)
    code, out = _generate(tmp_path, "--model", "someone/klein-single/flux-2-klein-4b.safetensors")
    assert code == 0 and out.exists()
    assert f"from {hub.DEFAULT_MODEL}, the official pairing" in caplog.text


def test_the_core_takes_repo_ids_too(offline):
    model = load_transformer(hub.DEFAULT_MODEL)
    assert model.variant.name == "distilled" and model.config.context_in_dim == 96


def test_a_repo_missing_offline_is_a_clear_error(offline, tmp_path, caplog):
    code, out = _generate(tmp_path, "--model", "nobody/not-cached")
    assert code == 2 and not out.exists()
    assert "nobody/not-cached (transformer/) is not in the Hugging Face cache" in caplog.text
    assert "HF_HUB_OFFLINE is set" in caplog.text


def test_a_local_path_is_never_taken_for_a_repo(tmp_path):
    (tmp_path / "org").mkdir()
    assert hub.parse(tmp_path / "org") is None
    assert hub.parse("./models/klein") is None and hub.parse("/abs/file.safetensors") is None
    assert hub.parse("org/repo@v1/sub/file.safetensors") == hub.HubRef(
        "org/repo", "v1", "sub/file.safetensors"
    )
    with pytest.raises(Flux2Error, match="does not exist"):
        load_transformer(tmp_path / "missing.safetensors")


def test_a_download_says_what_it_fetches_its_size_and_where_first(tmp_path, monkeypatch, caplog):
    """The online path, with huggingface_hub's network calls replaced: nothing is cached, the repo lists its
    files, and only the component's are fetched."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fetched = []

    def snapshot_download(repo_id, revision, allow_patterns, cache_dir, local_files_only=False):
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        fetched.append((repo_id, tuple(allow_patterns)))
        (tmp_path / "snap" / "vae").mkdir(parents=True)
        return str(tmp_path / "snap")

    class Info:
        siblings = [
            type("S", (), {"rfilename": name, "size": size})
            for name, size in [("vae/diffusion_pytorch_model.safetensors", 2**30), ("vae/config.json", 100),
                               ("transformer/x.safetensors", 8 * 2**30), ("model_index.json", 10)]
        ]  # fmt: skip

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, *a, **k: Info())
    caplog.set_level(logging.INFO)
    assert hub.local_path("org/repo", "vae") == tmp_path / "snap"
    assert f"downloading 3 file(s), 1.00 GB of org/repo into {tmp_path}" in caplog.text
    assert fetched == [("org/repo", ("model_index.json", "vae/*.safetensors", "vae/*.json"))]


def test_the_cache_folder_is_resolved_as_huggingface_hub_resolves_it(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == str(tmp_path / "xdg" / "huggingface" / "hub")
    monkeypatch.setenv("HF_HOME", "~/hf")
    assert hub.cache_dir().endswith("/hf/hub") and "~" not in hub.cache_dir()
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hub.cache_dir() == str(tmp_path / "legacy")


def test_a_pr_revision_and_an_unreachable_hub(monkeypatch, tmp_path):
    assert hub.parse("org/repo@refs/pr/3") == hub.HubRef("org/repo", "refs/pr/3", None)
    from huggingface_hub.errors import LocalEntryNotFoundError

    message = str(
        hub._hub_error(hub.HubRef("org/repo", None, "x.safetensors"), LocalEntryNotFoundError("no"))
    )
    assert "could not reach the Hugging Face Hub" in message and "has no file" not in message


def test_a_download_cut_short_goes_online_again(cache, monkeypatch, tmp_path):
    """A snapshot whose shard index names a shard that never arrived is not taken as complete."""
    import shutil

    import huggingface_hub

    copy = tmp_path / "hub"
    shutil.copytree(cache, copy)
    snapshot = copy / f"models--{hub.DEFAULT_MODEL.replace('/', '--')}" / "snapshots" / COMMIT / "transformer"
    shards = sorted(snapshot.glob("*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(copy))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    online = []
    real = huggingface_hub.snapshot_download

    def snapshot_download(**kwargs):
        if not kwargs.get("local_files_only"):
            online.append(kwargs["repo_id"])
            raise RuntimeError("network used")
        return real(**kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(hub, "_remote_files", lambda ref, patterns: {"transformer/x.safetensors": 1})
    with pytest.raises(Flux2Error, match="network used"):
        hub.local_path(hub.DEFAULT_MODEL, "transformer")
    assert online == [hub.DEFAULT_MODEL]


def test_a_local_diffusers_repository_gives_its_own_text_encoder_and_vae(cache, tmp_path, caplog):
    root = cache / f"models--{hub.DEFAULT_MODEL.replace('/', '--')}" / "snapshots" / COMMIT
    caplog.set_level(logging.INFO)
    out = tmp_path / "local.png"
    code = main(["generate", "--prompt", "x", "--model", str(root), "--width", "64", "--height", "64",
                 "--steps", "1", "--output", str(out)])  # fmt: skip
    assert code == 0 and out.exists()
    assert f"text encoder and VAE: from {root}, the model's own repository" in caplog.text
