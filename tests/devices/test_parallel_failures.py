"""A ``--parallel`` run whose process stops, or stalls, ends every process promptly with a clear message.

Two gloo processes on the CPU (spawned with the environment torchrun gives, as in ``test_parallel.py``) run
``generate`` from the command line on tiny random files, one scenario after the other, each with a fault
injected on one rank: rank 0 failing in its own work (a bad text encoder file, a crash in the VAE, an
interrupt), rank 1 failing while it loads its DiT, too little RAM for both processes' DiTs, and a rank that
never answers (before the text exchange and during sampling: the other one ends after
FLUX2_PARALLEL_TIMEOUT_MIN). The workers import no diffusers: the files are written here, before they start.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from pathlib import Path

import pytest
import torch
from test_parallel import WORLD, free_port, join_as, run_workers

from flux2_core import limits
from flux2_core.cli import inputs, parallel, run
from flux2_core.cli.main import main
from flux2_core.devices.parallel import TIMEOUT_ENV
from flux2_core.errors import Flux2Error

BAD_TEXT_ENCODER = "the text encoder file qwen.safetensors is damaged: download it again"
PROMPT = "a red fox in the snow"
SHORT = 0.05  # minutes (3 s): the collective timeout of the scenarios where a rank never answers
# scenario -> (FLUX2_PARALLEL_TIMEOUT_MIN, --parallel mode, {rank: fault}); a fault is (kind, step, error):
# "raise" an exception from a step, "stall" a step until the other rank has finished, or "no_ram".
SCENARIOS = {
    "ok": (1.0, "tensor", {}),
    "bad-text-encoder": (1.0, "tensor", {0: ("raise", "load_text_encoder", Flux2Error(BAD_TEXT_ENCODER))}),
    "vae-crash": (1.0, "sequence", {0: ("raise", "load_vae", RuntimeError("the VAE crashed"))}),
    "interrupt": (1.0, "tensor", {0: ("raise", "load_text_encoder", KeyboardInterrupt())}),
    "rank-1-fails": (1.0, "sequence", {1: ("raise", "load_transformer", Flux2Error("rank 1 cannot load"))}),
    "no-ram": (1.0, "sequence", {0: ("no_ram", None, None), 1: ("no_ram", None, None)}),
    "stall-before-text": (SHORT, "tensor", {1: ("stall", "load_transformer", None)}),
    # rank 1 first waits for rank 0's text encoding: twice as long, so that only sampling can time out
    "stall-in-sampling": (2 * SHORT, "sequence", {1: ("stall", "sample", None)}),
}
# the steps a fault replaces: (owner, attribute)
STEPS = {
    "load_text_encoder": (run, "load_text_encoder"),
    "load_vae": (run, "load_vae"),
    "sample": (run, "sample"),
    "load_transformer": (parallel.ParallelRanks, "load_transformer"),
    "available_memory": (limits, "available_memory"),
}


def _argv(files: dict, out: Path, mode: str) -> list[str]:
    return ["generate", "--model", str(files["model"]), "--text-encoder", str(files["text_encoder"]),
            "--vae", str(files["vae"]), "--prompt", PROMPT, "--width", "64", "--height", "64",
            "--steps", "2", "--device", "cpu", "--parallel", mode, "--output", str(out)]  # fmt: skip


def _fault(root: Path, name: str, rank: int):
    """The step to replace in this scenario on this rank and its replacement (None: nothing)."""
    fault = SCENARIOS[name][2].get(rank)
    if fault is None:
        return None
    kind, step, error = fault
    if kind == "no_ram":
        return STEPS["available_memory"], lambda device: 1
    original = getattr(*STEPS[step])
    if kind == "raise":

        def failing(*args, **kwargs):
            raise error

        return STEPS[step], failing

    def stalled(*args, **kwargs):  # until the other rank has given up on this one
        done, deadline = root / f"{name}.done.rank{1 - rank}", time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return original(*args, **kwargs)

    return STEPS[step], stalled


def _worker(rank: int, root: str, files: dict, ports: list[int]) -> None:
    root = Path(root)
    torch.set_num_threads(1)
    core_log, top = logging.getLogger("flux2_core"), logging.getLogger()
    top.setLevel(logging.INFO)
    for (name, (minutes, mode, _)), port in zip(SCENARIOS.items(), ports, strict=True):
        join_as(rank, port)
        os.environ[TIMEOUT_ENV] = str(minutes)
        handler = logging.FileHandler(root / f"{name}.rank{rank}.log")
        handler.setFormatter(logging.Formatter("%(message)s"))
        top.addHandler(handler)
        fault = _fault(root, name, rank)
        if fault is not None:
            (owner, attribute), replacement = fault
            original = getattr(owner, attribute)
            setattr(owner, attribute, replacement)
        start, outcome = time.monotonic(), {}
        try:
            outcome["rc"] = main(_argv(files, root / f"{name}.png", mode))
        except BaseException as e:  # what main lets through, as a single-process run would
            outcome["raised"] = f"{type(e).__name__}: {e}"
            outcome["traceback"] = traceback.format_exc()
        outcome["seconds"] = time.monotonic() - start
        if fault is not None:
            setattr(owner, attribute, original)
        top.removeHandler(handler)
        handler.close()
        core_log.setLevel(logging.NOTSET)  # as the next run's ranks find it
        core_log.filters.clear()
        outcome["log"] = (root / f"{name}.rank{rank}.log").read_text()
        (root / f"{name}.rank{rank}.json").write_text(json.dumps(outcome))
        (root / f"{name}.done.rank{rank}").touch()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """The folder of every scenario's outcome on each rank: rc (main's return) or raised, seconds, log."""
    from tiny_dit import make_diffusers_dit, write_bfl_file
    from tiny_text import make_tiny_qwen3, write_comfy_file
    from tiny_vae import random_vae_state_dict
    from tiny_vae import write_bfl_file as write_vae_file

    root = tmp_path_factory.mktemp("parallel_failures")
    files = {
        "model": str(
            write_bfl_file(make_diffusers_dit(seed=7, joint_attention_dim=96), root / "klein.safetensors")
        ),
        "text_encoder": str(write_comfy_file(make_tiny_qwen3(seed=5), root / "qwen_3_4b.safetensors")),
        "vae": str(write_vae_file(random_vae_state_dict(seed=6), root / "flux2-vae.safetensors")),
    }
    ports = [free_port() for _ in SCENARIOS]
    run_workers(_worker, str(root), files, ports, timeout=150)  # a scenario that hangs: the rest never run
    return root


def _outcomes(root: Path, name: str) -> list[dict]:
    """Each rank's outcome of scenario ``name``, which every rank must have come to the end of."""
    paths = [root / f"{name}.rank{rank}.json" for rank in range(WORLD)]
    missing = [rank for rank, path in enumerate(paths) if not path.exists()]
    assert not missing, f"rank(s) {missing} never ended scenario {name} (blocked in a collective?)"
    return [json.loads(path.read_text()) for path in paths]


def test_a_run_without_faults_writes_one_image_from_rank_0(outcomes):
    root = outcomes
    main_rank, other = _outcomes(root, "ok")
    assert main_rank.get("rc") == 0 and other.get("rc") == 0, (main_rank, other)
    assert (root / "ok.png").is_file()
    assert "saved" in main_rank["log"] and "saved" not in other["log"]


@pytest.mark.parametrize(
    "name, own_end, told",
    [
        ("bad-text-encoder", {"rc": 2}, BAD_TEXT_ENCODER),
        ("vae-crash", {"raised": "RuntimeError: the VAE crashed"}, "RuntimeError: the VAE crashed"),
        ("interrupt", {"rc": 130}, "interrupted"),
    ],
)
def test_when_rank_0_stops_the_others_end_at_once_with_its_message(outcomes, name, own_end, told):
    root = outcomes
    main_rank, other = _outcomes(root, name)
    # rank 0 ends as one process would: its own message (or exception, or interrupt), not the others'
    assert {k: main_rank.get(k) for k in own_end} == own_end, main_rank
    if name == "bad-text-encoder":
        assert f"error: {BAD_TEXT_ENCODER}" in main_rank["log"]
    if name == "interrupt":
        assert "interrupted: no image was written" in main_rank["log"]
    # rank 1 ends cleanly (an error line, no traceback) naming rank 0's failure, long before the timeout
    assert other.get("rc") == 2, other
    assert f"rank 1: error: rank 0 stopped: {told}" in other["log"], other["log"]
    assert "Traceback" not in other["log"]
    assert max(main_rank["seconds"], other["seconds"]) < 20
    assert not (root / f"{name}.png").exists()


def test_when_another_rank_stops_rank_0_ends_with_its_message(outcomes):
    main_rank, other = _outcomes(outcomes, "rank-1-fails")
    assert other.get("rc") == 2 and "rank 1: error: rank 1 cannot load" in other["log"], other
    assert main_rank.get("rc") == 2, main_rank
    assert "error: rank 1 stopped: rank 1 cannot load" in main_rank["log"], main_rank["log"]
    assert max(main_rank["seconds"], other["seconds"]) < 20


def test_the_ram_check_of_a_run_counts_both_processes(outcomes):
    for outcome in _outcomes(outcomes, "no-ram"):
        assert outcome.get("rc") == 2, outcome
        assert "on the CPU with the diffusion model of all 2 processes on this host" in outcome["log"]
        assert "rank 1 stopped" not in outcome["log"] and "rank 0 stopped" not in outcome["log"]
        assert outcome["seconds"] < 20


@pytest.mark.parametrize(
    "name, wait", [("stall-before-text", "sharing the text conditioning"), ("stall-in-sampling", "sampling")]
)
def test_a_rank_that_never_answers_ends_the_other_at_the_timeout(outcomes, name, wait):
    main_rank, other = _outcomes(outcomes, name)
    minutes = SCENARIOS[name][0]
    assert main_rank.get("rc") == 2, main_rank
    message = f"error: {wait}: no answer from the other processes in {minutes:g} min ({TIMEOUT_ENV})"
    assert message in main_rank["log"], main_rank["log"]
    assert "see the other ranks' logs" in main_rank["log"] and "Traceback" not in main_rank["log"]
    assert minutes * 60 - 0.5 < main_rank["seconds"] < minutes * 60 + 15
    # the stalled rank, once it goes on, finds rank 0 gone and says so
    assert other.get("rc") == 2, other
    assert "another process left the run" in other["log"], other["log"]


def test_the_ram_check_counts_every_process_on_this_host(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert parallel.processes_on_this_host(8) == 4  # 8 processes on 2 hosts: 4 here
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert parallel.processes_on_this_host(3) == 3  # not under torchrun: all of them
    gb = limits.GB
    free = {"cpu": 30 * gb, "cuda": 20 * gb}
    monkeypatch.setattr(limits, "available_memory", lambda device: free[device.type])
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    dit, text_encoder, activations = 12 * gb, 8 * gb, 4 * gb
    # each process has its own GPU: 12 + 4 GB on 20 GB fits, however many there are; RAM holds 2 DiTs
    inputs.check_memory(gpu, dit, text_encoder, activations, "x")
    inputs.check_memory(gpu, dit, text_encoder, activations, "x", processes=2, parallel="sequence")
    with pytest.raises(Flux2Error) as refused:
        inputs.check_memory(gpu, dit, text_encoder, activations, "x", processes=4, parallel="sequence")
    message = str(refused.value)
    assert "of all 4 processes on this host (4 x 12.0 GB)" in message
    assert "needs about 48.0 GB but CPU memory has 30.0 GB free" in message
    for fix in ("start fewer processes on this host", "--parallel tensor", "--dtype bfloat16", "quantised"):
        assert fix in message, message
    with pytest.raises(Flux2Error) as refused:  # already tensor parallel: the other fixes
        inputs.check_memory(gpu, dit, text_encoder, activations, "x", processes=3, parallel="tensor")
    assert "(3 x 12.0 GB) in RAM while the text runs needs about 36.0 GB" in str(refused.value)
    assert "--parallel tensor" not in str(refused.value)
    # on the CPU the processes also sample there: 12 + 8 GB fit one, 2 x (12 + 4) GB do not
    inputs.check_memory(cpu, dit, text_encoder, activations, "x")
    with pytest.raises(Flux2Error, match="on the CPU with the diffusion model of all 2 processes"):
        inputs.check_memory(cpu, dit, text_encoder, activations, "x", processes=2, parallel="sequence")
