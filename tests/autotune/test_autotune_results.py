"""Ranking, dry run and best.yaml (which must validate as a config)."""

from __future__ import annotations

from typing import Any

import yaml

from zerorun.autotune.classify import Outcome, TrialOutcome
from zerorun.autotune.results import best_yaml, dry_run, explanation, ranked
from zerorun.autotune.search import coarse_to_fine
from zerorun.autotune.space import build_space
from zerorun.config import load_config

START = {
    "train_micro_batch_size_per_gpu": 4,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 500_000_000, "overlap_comm": False},
}


def _fake(knobs: dict[str, Any]) -> TrialOutcome:
    bucket = knobs["reduce_bucket_size"]
    if bucket > 10**9 or bucket == 268_435_456:  # the top of the grid "runs out of memory"
        return TrialOutcome(Outcome.OOM, reason="rank 0: OutOfMemoryError")
    speed = 10.0 if bucket == 16_777_216 else 5.0 + (1.0 if knobs["overlap_comm"] else 0.0)
    return TrialOutcome(Outcome.FINISHED, median_step_s=1 / speed, samples_per_s=speed, peak_bytes=bucket)


def _result():
    space = build_space(2, START["zero_optimization"], hidden_size=4096)
    return coarse_to_fine(
        space, _fake, feasible=lambda k: "predicted 90 GiB > 76 GiB" if k["reduce_bucket_size"] == 1_048_576 else None
    )


def test_ranked_puts_finished_first_then_failures_then_pruned() -> None:
    order = [t.outcome.status for t in ranked(_result())]
    assert set(order) == {Outcome.FINISHED, Outcome.OOM, Outcome.PRUNED}
    last = {s: max(i for i, o in enumerate(order) if o is s) for s in set(order)}
    first = {s: order.index(s) for s in set(order)}
    assert last[Outcome.FINISHED] < first[Outcome.OOM] and last[Outcome.OOM] < first[Outcome.PRUNED]
    scores = [t.score for t in ranked(_result()) if t.score is not None]
    assert scores == sorted(scores, reverse=True)


def test_best_yaml_merges_the_winner_explains_and_validates(tmp_path) -> None:
    result = _result()
    text = best_yaml(START, result, "throughput")
    assert text.startswith("# zerorun autotune: best of")
    assert "(1 pruned by the memory estimate)" in text
    assert "reduce_bucket_size=1.68e+07" in text and "faster" in text
    path = tmp_path / "best.yaml"
    path.write_text(text)
    config = yaml.safe_load(text)
    assert config["zero_optimization"]["reduce_bucket_size"] == 16_777_216
    assert config["optimizer"] == START["optimizer"]
    cfg = load_config(str(path), world_size=2)  # what `zerorun validate` checks
    assert cfg.zero_optimization.reduce_bucket_size == 16_777_216


def test_explanation_when_nothing_finished() -> None:
    space = build_space(2, {"reduce_bucket_size": 4 * 10**9}, factor=1.5, each_side=1)
    result = coarse_to_fine(space, _fake)
    assert "no candidate finished" in explanation(result, "throughput")[0]
    assert yaml.safe_load(best_yaml(START, result, "throughput")) == START


def test_dry_run_lists_pruned_with_reasons() -> None:
    space = build_space(2, START["zero_optimization"], hidden_size=4096)
    rows = dry_run(space, lambda k: "too big" if k["reduce_bucket_size"] > 10**8 else None)
    assert rows[0][0] == space.start and rows[0][1] == "too big"
    assert {r for _, r in rows} == {None, "too big"}
