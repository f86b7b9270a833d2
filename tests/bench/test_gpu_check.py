"""scripts/gpu_check.sh --cpu: the GPU check's own code path, on CPU/gloo with tiny sizes.

The device run (CUDA, NCCL) needs a GPU; this runs the same checks end to end through the
script, so a check broken by a change fails here first. Memory is only reported in this
mode (there is no CUDA allocator to read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = (["setup"] + [f"parity/stage{s}-{d}" for s in range(4) for d in ("fp32", "bf16")]
            + ["stage3/zero_init", "stage3/offload_cpu", "stage3/offload_nvme", "checkpoint/stage2",
               "checkpoint/stage3"] + [f"memory/stage{s}" for s in range(4)]
            + ["memory/stage3-reuse0"] + [f"engine/live-stage{s}" for s in range(4)]
            + ["stage3/nvme-pinned"] + [f"setup/stage{s}" for s in range(3)]
            + ["collectives/world1", "sanitizer/parity"]
            + [f"syncs/stage{s}" for s in range(4)] + [f"throughput/stage{s}" for s in range(4)]
            + [f"throughput/stage{s}-offload_cpu" for s in (2, 3)] + [f"compile/stage{s}" for s in (2, 3)])


def test_gpu_check_dry_mode_runs_every_check_and_passes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHON"] = sys.executable
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["mode"], summary["backend"], summary["device"]) == ("cpu", "gloo", "cpu")
    assert summary["complete"] and summary["passed"]
    assert list(summary["checks"]) == EXPECTED
    failed = {n: c for n, c in summary["checks"].items() if not c["passed"]}
    assert not failed, failed
    for stage in range(4):
        parity = summary["checks"][f"parity/stage{stage}-fp32"]
        assert parity["losses"][-1] < parity["losses"][0]  # it trains, so parity means something
        assert parity["loss_rel_err"] <= 1e-5
    assert summary["checks"]["stage3/offload_cpu"]["pinned"] is False  # no CUDA: nothing to pin for
    memory = summary["checks"]["memory/stage3"]
    assert memory["dry"] and 0.5 < memory["breakdown_ratio"] < 2.0  # the figures are real ones
    coll = summary["checks"]["collectives/world1"]  # issued at world 1, each collective counted once
    assert all(coll["values_ok"].values()) and coll["calls"] == {
        "all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
    sanitizer = summary["checks"]["sanitizer/parity"]
    assert sanitizer["returncode"] == 0 and sanitizer["child_seconds"] is not None  # the child ran the parity checks
    assert summary["checks"]["memory/stage3-reuse0"]["dry"]
    for stage in range(4):
        assert summary["checks"][f"syncs/stage{stage}"]["syncs"] is None  # no CUDA: nothing to count
        speed = summary["checks"][f"throughput/stage{stage}"]
        assert speed["tokens_per_s"] > 0 and speed["model_tflops"] > 0 and speed["params"] > 0
    for stage in range(4):  # every collective issued at world 1 (gloo here), parity held
        live = summary["checks"][f"engine/live-stage{stage}"]
        assert live["live"] and live["calls"] and live["loss_rel_err"] <= 1e-5, live
    assert summary["checks"]["stage3/nvme-pinned"]["loss_rel_err"] <= 1e-5
    assert summary["checks"]["setup/stage1"]["device_masters"] == 0  # offloaded: no master on the device
    assert f"summary: {tmp_path / 'summary.json'}" in proc.stdout


def test_gpu_check_dry_run_prints_every_check_with_its_arithmetic() -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == list(EXPECTED)
    setup1 = next(line for line in lines if line.startswith("setup/stage1"))
    assert "bf16 model" in setup1 and "fp32 bucket" in setup1 and "device masters 0.000 GiB" in setup1
    assert "ring 2 x pow2" in next(line for line in lines if line.startswith("stage3/nvme-pinned"))
    assert "host syncs over 5 steps <= 5" in proc.stdout and "of the 480 s limit" in lines[-1]


def test_gpu_check_without_cuda_and_without_cpu_flag_says_so(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr and "--cpu" in proc.stderr
