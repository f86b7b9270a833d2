"""The tuner's bookkeeping: baseline facts, pruning, the ledger replay, timeouts, best.yaml.

A stand-in runner returns scripted outcomes so the logic runs in milliseconds; the same
Tuner drives real launcher runs in test_autotune_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from zerorun.autotune.classify import Outcome, TrialOutcome
from zerorun.autotune.prune import predicted_bytes
from zerorun.autotune.runner import TrialRun, TrialRunner
from zerorun.autotune.start import load_start, memory_context
from zerorun.autotune.tuner import TuneOptions, Tuner
from zerorun.config import load_config

PARAMS = 1_300_000_000
FACTS = {"hidden_size": 4096, "num_parameters": PARAMS}


@dataclass(frozen=True)
class ScriptedRunner(TrialRunner):
    """Throughput peaks at reduce_bucket_size 4 * 4096**2; overlap_comm=True "runs out of memory"."""

    calls: list[tuple[dict[str, Any], float | None]] = field(default_factory=list)

    def run(self, knobs: Mapping[str, Any], trial_dir: Path, timeout_s: float | None) -> TrialRun:
        self.calls.append((dict(knobs), timeout_s))
        if knobs["overlap_comm"]:
            return TrialRun(TrialOutcome(Outcome.OOM, reason="rank 0: OutOfMemoryError"), dict(FACTS), 5.0)
        distance = abs(knobs["reduce_bucket_size"].bit_length() - (4 * 4096**2).bit_length())
        rate = 100.0 / (1 + distance)
        return TrialRun(TrialOutcome(Outcome.FINISHED, 8 / rate, rate, 10**9), dict(FACTS), 30.0)


def _setup(tmp_path: Path, batch: int = 16, **options: Any) -> tuple[Tuner, ScriptedRunner]:
    config = tmp_path / "ds.yaml"
    config.write_text(yaml.safe_dump({"train_batch_size": batch, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                                      "bf16": {"enabled": True},
                                      "zero_optimization": {"stage": 2, "reduce_bucket_size": 4096**2}}))
    start = load_start(config, world_size=2)
    runner = ScriptedRunner(("--num_gpus", "2"), str(tmp_path / "train.py"), (), warmup=1, steps=2)
    opts = TuneOptions(out_dir=tmp_path / "out", knobs=("reduce_bucket_size", "overlap_comm"), **options)
    return Tuner(start, runner, opts), runner


def _gpu_that_fits_only_small_buckets(tuner: Tuner) -> int:
    """A GPU size between the start's prediction and that of the largest candidate."""
    ctx = memory_context(tuner.start, PARAMS, 10**12)
    assert ctx is not None
    small = predicted_bytes(ctx, tuner.start.knobs)
    large = predicted_bytes(ctx, {**tuner.start.knobs, "reduce_bucket_size": 16 * 4096**2})
    assert large > small
    return int((small + large) / 2 / 0.95)


def test_tuning_learns_from_the_baseline_prunes_and_survives_an_oom(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    probe, _ = _setup(tmp_path)
    tuner, runner = _setup(tmp_path, gpu_memory=_gpu_that_fits_only_small_buckets(probe))
    report = tuner.run()
    repeats = tuner.opts.repeats
    assert repeats >= 2  # every candidate is measured more than once
    assert all(knobs == tuner.start.knobs and timeout == 900.0 for knobs, timeout in runner.calls[:repeats])  # baseline
    assert all(timeout == 120.0 for _, timeout in runner.calls[repeats:])  # 4 x the 30 s baseline
    assert report.space.values["reduce_bucket_size"][2] == 4096**2  # centred on the learned hidden size
    statuses = {r.status for r in report.records.values()}
    assert {Outcome.FINISHED, Outcome.OOM, Outcome.PRUNED} <= statuses
    pruned = [r for r in report.records.values() if r.status is Outcome.PRUNED]
    assert all(r.knobs["reduce_bucket_size"] == 16 * 4096**2 for r in pruned) and "GiB per GPU >" in pruned[0].reason
    assert all(k["reduce_bucket_size"] != 16 * 4096**2 for k, _ in runner.calls)  # pruned never ran
    assert report.result.best is not None and report.result.best.knobs["reduce_bucket_size"] == 4 * 4096**2
    assert report.ran == len(runner.calls)

    best = yaml.safe_load(report.best_path.read_text())
    assert best["zero_optimization"]["reduce_bucket_size"] == 4 * 4096**2 and best["bf16"] == {"enabled": True}
    load_config(str(report.best_path), world_size=2)  # raises if it does not validate
    assert "faster" in report.best_path.read_text().splitlines()[2]

    lines = (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()
    again, rerunner = _setup(tmp_path, gpu_memory=tuner.opts.gpu_memory)
    replay = again.run()
    assert rerunner.calls == [] and replay.ran == 0 and replay.replayed == report.ran
    assert (tmp_path / "out" / "ledger.jsonl").read_text().splitlines() == lines  # pruned not re-appended
    assert replay.result.best is not None and replay.result.best.knobs == report.result.best.knobs


def test_a_changed_config_starts_afresh_in_the_same_ledger(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    tuner, _ = _setup(tmp_path, max_rounds=1)
    tuner.run()
    again, runner = _setup(tmp_path, batch=32, max_rounds=1)
    assert again.key != tuner.key
    again.run()
    assert runner.calls  # nothing replayed from the other run's records
    keys = {json.loads(line)["run_key"] for line in (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()}
    assert keys == {tuner.key, again.key}


def test_dry_run_lists_candidates_and_prune_reasons_without_running(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    probe, _ = _setup(tmp_path)
    gpu = _gpu_that_fits_only_small_buckets(probe)
    tuner, runner = _setup(tmp_path, hidden_size=4096, params=PARAMS, gpu_memory=gpu)
    space, plan, note = tuner.plan()
    assert note is None and runner.calls == [] and not (tmp_path / "out" / "ledger.jsonl").exists()
    verdicts = {(k["reduce_bucket_size"], k["overlap_comm"]): reason for k, reason in plan}
    assert verdicts[(4096**2, False)] is None
    assert "GiB per GPU >" in (verdicts[(16 * 4096**2, False)] or "")
    _, _, off = _setup(tmp_path, hidden_size=4096, gpu_memory=gpu)[0].plan()
    assert off is not None and "--params" in off


@dataclass(frozen=True)
class CrashingRunner(TrialRunner):
    calls: list[dict[str, Any]] = field(default_factory=list)

    def run(self, knobs: Mapping[str, Any], trial_dir: Path, timeout_s: float | None) -> TrialRun:
        self.calls.append(dict(knobs))
        return TrialRun(TrialOutcome(Outcome.CRASH, reason="rank 1: ModuleNotFoundError: No module named 'x'"),
                        {}, 2.0, trial_dir / "output.log")


def test_a_crashed_baseline_stops_the_search_with_its_cause(tmp_path: Path) -> None:
    import pytest

    from zerorun.autotune.tuner import BaselineFailed

    (tmp_path / "train.py").write_text("import x\n")
    tuner, _ = _setup(tmp_path)
    runner = CrashingRunner(("--num_gpus", "2"), str(tmp_path / "train.py"), (), warmup=1, steps=2)
    tuner.runner = runner
    with pytest.raises(BaselineFailed, match="No module named 'x'") as err:
        tuner.run()
    assert len(runner.calls) == 1  # not repeated, and no candidate after it
    assert "output.log" in (err.value.hint or "")
