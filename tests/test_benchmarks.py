"""The benchmark suite runs on a CPU for every family it covers, and its memory measure counts what it says.

``benchmarks/suite.py --gpu-real`` builds the real klein, dev and Fill shapes on a GPU; the same code builds
each family's medium shape here (tiny widths), so a broken builder or a call that no longer matches an
implementation shows without a GPU. Each case's outputs must agree across implementations (the suite
compares them with ours), and our step's peak of live tensors must not exceed diffusers' on the FLUX.2
cases (the leaner-step bound the suite reports at real widths).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from live_tensors import LiveTensors, peak_tensor_bytes  # noqa: E402

TINY = "--heads 1 --depth 1 --single 1 --text-width 32 --sizes 64 --edit-size 64 --ref-size 64 --refs 1"


def test_live_tensors_counts_each_storage_while_it_lives():
    def work():
        a = torch.ones(1024, dtype=torch.float32)  # 4 KiB
        b = a.view(32, 32) * 2  # 4 KiB more; the view adds nothing
        del a
        c = torch.zeros(2048, dtype=torch.float64)  # 16 KiB, with b alive
        return b.sum() + c.sum()

    with torch.inference_mode():
        # at the last add: b, c, b.sum() (float32), c.sum() and their sum (float64)
        assert peak_tensor_bytes(work) == 4096 + 16384 + 4 + 8 + 8
        outside = torch.ones(4096)  # made before the call: not counted
        with LiveTensors() as live:
            y = outside + 1
            del y
        assert live.peak == 4 * 4096 and live.current == 0


def test_suite_runs_every_family_on_a_cpu_and_the_implementations_agree(tmp_path):
    out = tmp_path / "suite.json"
    cmd = [sys.executable, "suite.py", "--shapes", "klein-4b", "dev", "fill", *TINY.split()]
    cmd += ["--rounds", "1", "--skip", "text", "vae", "e2e", "load", "--json", str(out)]
    run = subprocess.run(cmd, cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    shapes = json.loads(out.read_text())["shapes"]
    assert list(shapes) == ["medium", "dev medium", "fill medium"]
    expected = {
        "medium": ["t2i 64²", "edit 64² + 1 ref", "KV cached 64² + 1 ref", "KV extract 64² + 1 ref"],
        "dev medium": ["t2i 64²", "edit 64² + 1 ref"],  # no KV model for dev
        "fill medium": ["fill 64²"],
    }
    for label, names in expected.items():
        dit = shapes[label]["dit"]
        skipped = [n for n in dit if n.endswith("skipped by the step cache")]
        assert skipped == [f"{names[0]} skipped by the step cache"], label
        for name in names:
            impls = dit[name]["impls"]
            assert impls["diffusers"]["max_abs_diff_vs_ours"] < 1e-4, (label, name)
            ours, theirs = impls["ours"]["peak_tensors_above"], impls["diffusers"]["peak_tensors_above"]
            assert ours > 0 and theirs > 0
            if label != "fill medium":
                assert ours <= theirs, (label, name, ours, theirs)
    assert "peak memory above the start of each call" in run.stdout


def test_gpu_real_dry_run_adds_up_each_stage_and_fits_an_80_gb_card(tmp_path):
    """``--gpu-real --dry-run``: every real shape built on the meta device, the device memory of each stage
    added up; the run as ordered must fit an 80 GB card (the smaller of the cards the GPU check targets)."""
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "suite.py", "--gpu-real", "--dry-run", "--shapes", "klein-4b", "klein-9b", "dev"]
    cmd += ["fill", "--card-gb", "80", "--json", str(out)]
    run = subprocess.run(cmd, cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    plan = json.loads(out.read_text())
    assert plan["dry_run"] and list(plan["shapes"]) == ["klein-4b", "klein-9b", "dev", "fill"]
    gib = 2**30
    for label, shape in plan["shapes"].items():
        stages = {s["stage"]: s for s in shape["stages"]}
        assert shape["peak_bytes"] <= 0.95 * 80 * gib, (label, shape["peak_bytes"] / gib)
        assert shape["peak_bytes"] == max(s["total_bytes"] for s in stages.values())
        dit = stages["diffusers' DiT"]["held_bytes"]
        # diffusers' DiT in bf16: 2 bytes a parameter (klein 9B: 9.08 B parameters, 16.9 GiB)
        assert dit > {"klein-4b": 7, "klein-9b": 16.5, "dev": 16, "fill": 22}[label] * gib
        # ours shares the state dict it is built from and native counts as one more copy of it
        assert stages["DiT cases"]["held_bytes"] == stages["+ its BFL state dict"]["held_bytes"]
        assert stages["DiT cases"]["extra_bytes"] > stages["+ its BFL state dict"]["held_bytes"] - dit
    dev = {s["stage"]: s for s in plan["shapes"]["dev"]["stages"]}
    # the Fun ControlNet beside the dev cases: one control block per two double blocks (here 1), whose
    # weights (a double block, the 260-channel input and two projections: 1.04 B parameters) add 1.9 GiB
    control = dev["+ Fun ControlNet (1 blocks)"]
    added = control["held_bytes"] - dev["DiT cases"]["held_bytes"]
    assert 1.85 * gib < added < 2.0 * gib, added / gib
    assert control["extra_bytes"] > dev["DiT cases"]["extra_bytes"]  # and its hints
    nine = {s["stage"]: s for s in plan["shapes"]["klein-9b"]["stages"]}
    # the load probe runs before ours and native exist: the parent holds diffusers' DiT and the state dict
    assert nine["load probe"]["total_bytes"] < nine["DiT cases"]["total_bytes"]
    assert list(nine) == ["diffusers' DiT", "+ its BFL state dict", "load probe", "DiT cases",
                          "text encoders", "VAE", "end to end"]  # fmt: skip


def test_the_control_cost_benchmark_runs_plain_and_controlled_steps(tmp_path):
    """``control_cost.py`` at a tiny width: both steps timed, the controlled one with more weights (the
    control block) and its hints' memory in the plan's allowance."""
    out = tmp_path / "control.json"
    cmd = [sys.executable, "control_cost.py", "--heads", "1", "--size", "64", "--text-tokens", "8",
           "--dtype", "float32", "--share-single", "--repeats", "1", "--json", str(out)]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "controlled / plain: time" in run.stdout and "2+12 blocks and 1 control block(s)" in run.stdout
    report = json.loads(out.read_text())
    assert set(report["median_s"]) == {"plain", "controlled"}
    assert report["weight_bytes"]["controlled"] > report["weight_bytes"]["plain"]
    assert report["planned_hint_bytes"] == 16 * (128 + 260) * 4  # one hint and the context, 16 tokens


def test_gpu_real_dry_run_refuses_a_card_too_small_and_names_the_shape():
    cmd = [sys.executable, "suite.py", "--gpu-real", "--dry-run", "--shapes", "klein-4b", "klein-9b"]
    cmd += ["--skip", "text", "vae", "e2e", "load", "--card-gb", "40"]
    run = subprocess.run(cmd, cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=600)
    assert run.returncode == 1
    assert "does not fit 40 GiB: klein-9b" in run.stderr and "klein-4b (" not in run.stderr


def test_suite_fp8_weights_run_every_implementation_on_fp8_blocks(tmp_path):
    """``--weights fp8``: ours and native load the same scaled fp8 block weights (they agree as closely as
    in bf16 when native is present); diffusers stores its own unscaled fp8: it differs by fp8's rounding."""
    out = tmp_path / "fp8.json"
    cmd = [sys.executable, "suite.py", "--shapes", "klein-4b", *TINY.split(), "--weights", "fp8"]
    cmd += ["--rounds", "1", "--skip", "text", "vae", "e2e", "load", "--json", str(out)]
    run = subprocess.run(cmd, cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    shape = json.loads(out.read_text())["shapes"]["medium"]
    assert shape["weights"] == "fp8"
    assert [s["stage"] for s in shape["memory"]][2:4] == ["quantising to fp8", "fp8 weights"]
    for name, case in shape["dit"].items():
        impls = case["impls"]
        if "diffusers" in impls:
            assert 0 < impls["diffusers"]["max_abs_diff_vs_ours"] < 0.5, name
        if "native" in impls:
            assert impls["native"]["max_abs_diff_vs_ours"] < 1e-4, name


def test_the_cpu_profile_splits_a_step_by_kind_of_work(tmp_path):
    """``cpu_profile.py`` at a tiny width in bf16, ours and diffusers' forward on the same weights: every kind
    of work timed, the shares and the re-layout within the step, the page faults counted, the attention
    kernel's choice listed."""
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "cpu_profile.py", "--shapes", "klein-4b", "dev", "--heads", "1", "--sizes", "64",
           "--refs", "0", "1", "--rounds", "1", "--impls", "ours", "diffusers",
           "--json", str(out)]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    cases = ("klein-4b t2i 64²", "klein-4b edit 64² + 1 ref", "dev t2i 64²", "dev edit 64² + 1 ref")
    assert set(report["cases"]) == {f"{c} {impl}" for c in cases for impl in ("ours", "diffusers")}
    for name, case in report["cases"].items():
        parts = case["parts_s"]
        assert parts["linear"] > 0 and parts["attention"] > 0
        if name.endswith("ours"):  # q/k norm and RoPE in one pass below float32
            assert parts["qk norm + rope"] > 0
        else:  # diffusers' own norm and rotary embedding
            assert parts["qk norm"] > 0 and parts["rope"] > 0
        assert abs(sum(parts.values()) - case["total_s"]) < 1e-9  # the rest is what the kinds leave
        assert 0 <= case["relayout_s"] and case["page_faults"] >= 0
    assert "| klein-4b | t2i 64² | ours |" in run.stdout and "| dev | t2i 64² | diffusers |" in run.stdout
    assert "attention kernels chosen" in run.stdout
