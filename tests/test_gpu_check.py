"""The device check script runs end to end without a GPU: ``benchmarks/gpu_check.sh OUT --dry-run`` runs
every step (the suite on the meta device, the others at tiny shapes on the CPU) and writes each step's JSON,
so its plumbing holds before a GPU is lent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = ["plan", "suite", "suite_fp8", "formats", "quant_compute", "control", "streaming", "interrupt",
         "parallel"]  # fmt: skip


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the device check is a bash script using coreutils' timeout")  # fmt: skip
def test_gpu_check_dry_run_runs_every_step_and_writes_its_json(tmp_path):
    out = tmp_path / "check"
    env = os.environ | {"PYTHON": sys.executable}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out), "--dry-run"],
                         capture_output=True, text=True, env=env, timeout=1200)  # fmt: skip
    logs = {p.name: p.read_text()[-1500:] for p in out.glob("*.log")}
    assert run.returncode == 0, run.stdout[-3000:] + json.dumps(logs, indent=1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True and all(summary[s]["rc"] == 0 for s in STEPS), summary
    plan = json.loads((out / "plan.json").read_text())
    assert plan["dry_run"] and set(plan["shapes"]) == {"klein-4b", "klein-9b"}
    assert all(s["peak_bytes"] <= 0.95 * plan["card_bytes"] for s in plan["shapes"].values())
    formats = json.loads((out / "formats.json").read_text())["measured"]
    assert {"bf16", "fp8", "nvfp4", "gguf-Q8_0"} <= set(formats)
    assert formats["fp8"]["held_bytes"] < formats["bf16"]["held_bytes"]
    quant = json.loads((out / "quant_compute.json").read_text())["shapes"]
    assert set(quant) == {"klein-4b", "klein-9b"}
    for shape in quant.values():  # the CPU dequantises fp8, nvfp4 and AWQ (no kernel here), and says so
        rows = shape["rows"]
        assert {"ours bf16", "ours fp8 auto", "ours fp8 dequantize", "ours nvfp4 auto"} <= set(rows)
        assert {"ours w4a8 auto", "ours w4a8 dequantize", "ours awq auto", "ours awq dequantize"} <= set(rows)
        assert "compute capability 8.9" in rows["ours fp8 auto"]["choice"]["float8_e4m3fn"]
        assert "int8 (W4A8) matmul" in rows["ours w4a8 auto"]["choice"]["asym_w4a8_int8"]
        assert "dequantise-then-matmul" in rows["ours awq auto"]["choice"]["awq_w4a16"]
        for fmt in ("nvfp4", "w4a8", "awq"):
            assert 0 < rows[f"ours {fmt} dequantize"]["error"] < 0.1, fmt
    control = json.loads((out / "control.json").read_text())
    assert set(control["median_s"]) == {"plain", "controlled"} and control["planned_hint_bytes"] > 0
    assert json.loads((out / "streaming_cost.json").read_text())["identical"] is True
    stopped = json.loads((out / "streaming_interrupt.json").read_text())
    assert stopped["ok"] and stopped["clean_run_identical"]
    assert all(r["stopped"] and r["device_bytes"] == 0 for r in stopped["runs"].values())
    parallel = json.loads((out / "parallel.json").read_text())
    assert parallel["ok"] and parallel["backend"] == "gloo"
    assert all(parallel[m]["max_abs_diff_vs_one_process"] < 1e-4 for m in ("tensor", "sequence"))
    assert "torch" in (out / "machine.txt").read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="the device check is a bash script")
def test_gpu_check_says_which_packages_it_needs_before_the_first_step(tmp_path):
    # a Python without diffusers: a stub that fails every import the way a bare install does
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'diffusers'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    out = tmp_path / "check"
    env = os.environ | {"PYTHON": str(fake)}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out), "--dry-run"],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert run.returncode == 2 and 'pip install -e ".[test]"' in run.stderr and "diffusers" in run.stderr
    assert not (out / "plan.log").exists()  # no step ran
