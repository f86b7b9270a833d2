"""scripts/gpu_check.sh --peers --cpu: the side-by-side GPU call's own code path, tiny, on CPU/gloo.

Where DeepSpeed is not importable (CI), its rows are skipped with one line and the run still
passes; the DeepSpeed-present path is run by hand with DS_PYTHON (BENCHMARKS.md). The depth
search of part 2 is checked against a stand-in probe with a known limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import gpu_peers_offload as O
from bench.gpu_peers_model import OFFLOAD_GPU, loss_agreement

ROOT = Path(__file__).resolve().parents[2]


def test_peers_dry_mode_runs_every_part(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "DS_PYTHON")}
    env["PYTHON"] = sys.executable
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--peers", "--cpu", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = summary["parts"]
    assert list(parts) == ["throughput", "kernels", "offload"] and not any("error" in p for p in parts.values())
    ds = summary["env"]["deepspeed_python"]
    assert ds or "SKIP DeepSpeed" in proc.stdout  # skipped with a line where it is not installed
    systems = parts["throughput"]["systems"]
    want = ["zerorun-z0", "zerorun-z1", "zerorun-z2", "zerorun-z3", "fsdp2"] + ([f"ds-z{s}" for s in range(4)] if ds else [])
    assert sorted(systems) == sorted(want)
    for row in systems.values():
        assert row["tokens_per_s"] > 0 and row["losses"][-1] < row["losses"][0], row  # it trains
    assert parts["throughput"]["losses"]["passed"], parts["throughput"]["losses"]  # same weights, data and seed
    searches = parts["offload"]["searches"]
    for placement in O.PLACEMENTS:  # the tiny model fits at the top depth everywhere it runs
        assert searches[f"zerorun/{placement}"]["largest_depth"] == 2, searches[f"zerorun/{placement}"]
        ds_probes = searches[f"ds/{placement}"]["probes"]
        assert ds_probes and (ds_probes[0].get("fits") if ds else ds_probes[0].get("skipped"))
    probe = searches["zerorun/stage3-nvme"]["probes"][0]
    assert probe["estimate_nvme"] > probe["estimate_cpu"] > 0  # the estimate's row beside the probe
    kernels = parts["kernels"]
    assert kernels["quant"]["passed"] and kernels["compensated"]["passed"] and kernels["nvme"]["same_bytes"], kernels
    assert kernels["compensated"]["nearest"]["kept_of_fp32_move"] < 0.5  # the loss the compensation removes
    md = (tmp_path / "summary.md").read_text()
    assert "## 1. Throughput" in md and "## 2. Largest model" in md and "## 3. Kernels" in md


def _fake_probe(limit: int, calls: list[tuple[str, str, int]]) -> O.Probe:
    def probe(system: str, placement: str, depth: int, timeout: float) -> dict:
        calls.append((system, placement, depth))
        return {"fits": depth <= limit + (4 if system == "zerorun" else 0), "step_s": 1.0 + depth / 100}
    return probe


def test_depth_search_brackets_the_limit_and_compares_at_deepspeeds_largest() -> None:
    calls: list[tuple[str, str, int]] = []
    probe = _fake_probe(17, calls)
    results = O.search(probe, dict.fromkeys(O.PLACEMENTS, 10), 1, 64, time.monotonic() + 60, 10)
    for placement in O.PLACEMENTS:
        assert results[f"ds/{placement}"]["largest_depth"] == 17 and results[f"ds/{placement}"]["closed"]
        assert results[f"zerorun/{placement}"]["largest_depth"] == 21
        assert len(results[f"ds/{placement}"]["probes"]) <= 8  # few probes: up 1.25x, then bisection
    compare = O.compare_at_ds_largest(results, probe, time.monotonic() + 60, 10, OFFLOAD_GPU)
    row = compare["stage3-cpu"]
    assert row["depth"] == 17 and row["zerorun_step_s"] == row["ds_step_s"] == 1.17
    assert row["largest_ratio"] == OFFLOAD_GPU.with_layers(21).params / OFFLOAD_GPU.with_layers(17).params
    # the searches take turns: the first six probes are one of each
    assert len({(s, p) for s, p, _ in calls[:6]}) == 6


def test_depth_search_goes_down_from_a_start_that_does_not_fit_and_stops_at_its_deadline() -> None:
    assert O.next_depth({}, 30, 1, 64) == 30
    assert O.next_depth({30: False}, 30, 1, 64) == 24
    assert O.next_depth({30: False, 24: True}, 30, 1, 64) == 27
    assert O.next_depth({30: False, 24: True, 27: True, 28: False}, 30, 1, 64) is None
    assert O.next_depth({1: False}, 30, 1, 64) is None  # nothing fits at all
    assert O.next_depth({64: True}, 30, 1, 64) is None  # the bound
    results = O.search(_fake_probe(5, []), dict.fromkeys(O.PLACEMENTS, 10), 1, 64, time.monotonic() - 1, 10)
    assert all(not r["probes"] and not r["closed"] for r in results.values())  # out of time: said, not guessed


def test_the_first_probe_is_the_estimates_depth_for_the_card_and_host() -> None:
    big_host = O.predicted_depth(OFFLOAD_GPU, 2, "cpu", 22 * 2**30, 10**15, 10**15, 200)
    small_host = O.predicted_depth(OFFLOAD_GPU, 2, "cpu", 22 * 2**30, 100 * 10**9, 10**15, 200)
    assert small_host < big_host  # host memory binds the optimizer offload (16 bytes a parameter there)
    assert O.estimate(OFFLOAD_GPU.with_layers(small_host), 2, "cpu").cpu_per_node <= 100 * 10**9


def test_loss_agreement_is_within_bf16_tolerance_or_says_not() -> None:
    assert loss_agreement({"a": [4.0, 3.5], "b": [4.0, 3.52]})["passed"]
    out = loss_agreement({"a": [4.0, 3.5], "b": [4.0, 3.0]})
    assert not out["passed"] and abs(out["worst"]["b"] - 0.5 / 3.5) < 1e-12
