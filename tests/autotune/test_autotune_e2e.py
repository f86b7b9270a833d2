"""`zerorun autotune` end to end: 2 gloo ranks of examples/train_toy.py, through the CLI.

One tuning run of the toy at a tiny size (hidden 16, 2 blocks) with 3-step trials over a
small space (reduce_bucket_size at 3 values, overlap_comm on/off: 4 trials). A test
memory cap makes every overlap_comm=True candidate "run out of memory" (this machine
has no GPU to exhaust; the engine checks the cap after each optimizer step and raises
a MemoryError, which its recorder classifies as OOM): the test checks that the OOM is
recorded as such and the search goes on. A second run of the same command replays
the ledger and runs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerorun.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 256},
}
# The toy at hidden 16, 2 blocks: 4,528 fp32 parameters on 2 ranks hold 49,416 bytes of model
# state (params 18,112 + gradient shard 9,056 + Adam shard 18,116 + one 1,024-element staging
# buffer 4,096, the largest parameter being fc1's 16x64). overlap_comm adds a second staging
# buffer (+4,096 bytes) whatever reduce_bucket_size won round one, so a cap between the two OOMs
# exactly the overlap_comm=True trial.
MEMORY_CAP = 51_000


def _autotune(tmp_path: Path, out: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "ds.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    argv = [
        sys.executable, "-m", "zerorun.cli", "autotune", "--num_gpus", "2", "--config", str(config),
        "--trial-steps", "3", "--warmup-steps", "1", "--knobs", "reduce_bucket_size,overlap_comm",
        "--grid-points", "1", "--rounds", "1", "--repeats", "2", "--out", str(out), "--json",
        str(ROOT / "examples" / "train_toy.py"), "--steps", "1000", "--hidden", "16", "--layers", "2",
    ]
    env = {**os.environ, "ZERORUN_TEST_MEMORY_CAP_BYTES": str(MEMORY_CAP), "COLUMNS": "200"}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)


def _ledger(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


@pytest.mark.timeout(480)  # 7 trial runs of 2 ranks: ~75 s of CPU, minutes when 4 test workers share 2 cores
def test_autotune_tunes_the_toy_survives_an_oom_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "tuned"
    first = _autotune(tmp_path, out)
    assert first.returncode == 0, first.stdout + first.stderr
    records = _ledger(out)
    # start, reduce 64 and 1024 (hidden 16 -> centre 256), each measured twice; overlap on fails once, not rerun
    assert len(records) == 7, records
    by_status: dict[str, list[dict]] = {}
    for r in records:
        by_status.setdefault(r["status"], []).append(r)
    assert [r["knobs"]["overlap_comm"] for r in by_status["oom"]] == [True]
    assert "TrialMemoryCapExceeded" in by_status["oom"][0]["reason"]
    finished = by_status["finished"]
    assert len(finished) == 6 and all(r["samples_per_s"] > 0 and r["peak_bytes"] <= MEMORY_CAP for r in finished)
    assert sorted((r["knobs"]["reduce_bucket_size"], r["repeat"]) for r in finished) == [
        (64, 0), (64, 1), (256, 0), (256, 1), (1024, 0), (1024, 1)]
    order = [(r["knobs"]["reduce_bucket_size"], r["repeat"]) for r in finished[2:]]  # after the baseline's two
    assert order == [(64, 0), (1024, 0), (64, 1), (1024, 1)]  # interleaved, not 64 64 1024 1024
    assert finished[0]["facts"]["hidden_size"] == 16 and finished[0]["facts"]["num_parameters"] == 4528

    best = out / "best.yaml"
    text = best.read_text()
    assert text.startswith("# zerorun autotune: best of 4 trials")
    winner = max(finished, key=lambda r: r["samples_per_s"])
    tuned = yaml.safe_load(text)
    assert tuned["zero_optimization"]["reduce_bucket_size"] == winner["knobs"]["reduce_bucket_size"]
    assert tuned["zero_optimization"]["overlap_comm"] is False and tuned["train_batch_size"] == 8
    assert cli_main(["validate", str(best), "--world-size", "2"]) == 0
    report = json.loads(first.stdout)  # --json: the ranked trials as data
    assert [t["status"] for t in report["trials"]] == ["finished"] * 3 + ["oom"]
    assert all(t["spread"] is not None and t["spread"] >= 0 for t in report["trials"][:3])
    assert report["best"]["knobs"]["reduce_bucket_size"] == winner["knobs"]["reduce_bucket_size"]

    second = _autotune(tmp_path, out)
    assert second.returncode == 0, second.stdout + second.stderr
    again = json.loads(second.stdout)
    assert (again["ran"], again["replayed"]) == (0, 7)
    assert len(_ledger(out)) == 7  # nothing was rerun or rewritten
    assert yaml.safe_load(best.read_text()) == tuned
