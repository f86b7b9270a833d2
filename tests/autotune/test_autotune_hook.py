"""The engine's side of a trial: the config merge, the hidden-size guess, the test memory cap."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from torch import nn

from zerorun.autotune.classify import Outcome, classify
from zerorun.engine.trial import guess_hidden_size, trial_config
from zerorun.trial.protocol import (
    ENV_MEMORY_CAP,
    TrialMemoryCapExceeded,
    TrialProtocolError,
    TrialRecorder,
    TrialSpec,
    memory_cap,
)


def test_outside_a_trial_the_source_is_untouched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ZERORUN_TRIAL_OVERRIDES", raising=False)
    assert trial_config("ds.yaml") == "ds.yaml"


def test_a_trial_merges_its_knobs_over_the_users_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": False}}))
    monkeypatch.setenv("ZERORUN_TRIAL_OVERRIDES", json.dumps({"reduce_bucket_size": 1024, "overlap_comm": True}))
    merged = trial_config(str(path))
    assert merged == {"train_batch_size": 8,
                      "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 1024}}
    assert yaml.safe_load(path.read_text())["zero_optimization"]["overlap_comm"] is False  # file unchanged


class _MLP(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(h, 4 * h), nn.Linear(4 * h, h), nn.Linear(h, 4 * h),
                                     nn.Linear(4 * h, h), nn.Linear(h, h)])


def test_hidden_size_guess() -> None:
    assert guess_hidden_size(_MLP(24)) == 24  # in_features 24 three times, 96 twice
    with_config = _MLP(24)
    with_config.config = SimpleNamespace(hidden_size=4096)  # type: ignore[attr-defined]
    assert guess_hidden_size(with_config) == 4096
    assert guess_hidden_size(nn.Embedding(10, 7)) == 7
    assert guess_hidden_size(nn.ReLU()) is None


def test_memory_cap_is_read_and_checked(tmp_path: Path) -> None:
    assert memory_cap({}) is None and memory_cap({ENV_MEMORY_CAP: "1000"}) == 1000
    with pytest.raises(TrialProtocolError):
        memory_cap({ENV_MEMORY_CAP: "lots"})
    spec = TrialSpec({}, warmup=0, steps=5, result_path=tmp_path / "result.json")
    held = [900]
    recorder = TrialRecorder(spec, rank=1, held_bytes=lambda: held[0], memory_cap=1000, exit=lambda code: None,
                             facts={"hidden_size": 16})
    assert recorder.step_done() is False  # under the cap
    held[0] = 1001
    with pytest.raises(TrialMemoryCapExceeded) as err:
        recorder.step_done()
    recorder.record_failure(err.value)  # what the excepthook does in a real trial
    outcome = classify(1, spec.result_path)
    assert outcome.status is Outcome.OOM and "1001 bytes > test cap 1000" in outcome.reason
    record = json.loads((tmp_path / "result.json.rank1").read_text())
    assert record["facts"] == {"hidden_size": 16}
