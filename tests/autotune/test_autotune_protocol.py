"""The trial protocol: env in, result file out, exercised in real child processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zerorun.autotune.classify import Outcome, classify
from zerorun.trial.protocol import (
    ENV_OVERRIDES,
    ENV_RESULT,
    TrialProtocolError,
    TrialRecorder,
    TrialSpec,
    apply_overrides,
    is_out_of_memory,
    read_trial_overrides,
)

# A stand-in for a training script whose engine wires the recorder (the real engine makes
# the same two calls): `steps` optimizer steps, then optionally an exception.
CHILD = textwrap.dedent(
    """
    import sys, time
    from zerorun.trial.protocol import TrialRecorder, apply_overrides, read_trial_overrides
    config = apply_overrides({"zero_optimization": {"stage": 2}}, read_trial_overrides())
    recorder = TrialRecorder.from_env(rank=0, samples_per_step=8, peak_bytes=lambda: 1234)
    fail = sys.argv[1]
    assert config["zero_optimization"]["reduce_bucket_size"] == 1000, config
    for step in range(100):
        time.sleep(0.01)
        if fail == "oom" and step == 2:
            raise MemoryError("cannot allocate")
        if fail == "error" and step == 2:
            raise ValueError("bad shape")
        recorder.step_done()
    """
)


def _run_child(tmp_path: Path, fail: str) -> tuple[int, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    spec = TrialSpec({"reduce_bucket_size": 1000}, warmup=2, steps=3, result_path=tmp_path / "result.json")
    env = {**__import__("os").environ, **spec.env()}
    proc = subprocess.run([sys.executable, str(script), fail], env=env, capture_output=True, text=True, timeout=60)
    return proc.returncode, spec.result_path


def test_a_trial_records_median_step_time_and_exits_cleanly(tmp_path: Path) -> None:
    code, path = _run_child(tmp_path, "none")
    assert code == 0
    result = json.loads(path.read_text())
    assert result["status"] == "ok" and result["peak_bytes"] == 1234
    assert len(result["step_times_s"]) == 3  # warm-up steps are not timed
    assert result["median_step_s"] >= 0.009
    assert result["samples_per_s"] == pytest.approx(8 / result["median_step_s"])
    outcome = classify(code, path)
    assert outcome.status is Outcome.FINISHED and outcome.samples_per_s == result["samples_per_s"]


def test_out_of_memory_is_recorded_by_exception_type(tmp_path: Path) -> None:
    code, path = _run_child(tmp_path, "oom")
    assert code == 1 and not path.exists()
    outcome = classify(code, path)
    assert outcome.status is Outcome.OOM and "MemoryError" in outcome.reason


def test_other_exceptions_are_crashes_with_the_error(tmp_path: Path) -> None:
    code, path = _run_child(tmp_path, "error")
    outcome = classify(code, path)
    assert outcome.status is Outcome.CRASH and "ValueError: bad shape" in outcome.reason


def test_overrides_merge_over_the_scripts_config() -> None:
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}}
    merged = apply_overrides(config, {"stage3_prefetch_bucket_size": 10, "overlap_comm": False})
    assert merged["zero_optimization"] == {"stage": 3, "stage3_prefetch_bucket_size": 10, "overlap_comm": False}
    assert merged["train_batch_size"] == 64 and config["zero_optimization"] == {"stage": 3}
    batch = apply_overrides(config, {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2})
    assert (batch["train_micro_batch_size_per_gpu"], batch["gradient_accumulation_steps"]) == (8, 2)
    assert "train_batch_size" not in batch
    assert apply_overrides(config, None) == config


def test_read_overrides_and_spec_from_env(tmp_path: Path) -> None:
    assert read_trial_overrides({}) is None
    assert TrialSpec.from_env({}) is None
    spec = TrialSpec({"overlap_comm": True}, 1, 5, tmp_path / "r.json")
    assert TrialSpec.from_env(spec.env()) == spec
    with pytest.raises(TrialProtocolError, match="not valid JSON"):
        read_trial_overrides({ENV_OVERRIDES: "{oops"})
    with pytest.raises(TrialProtocolError, match="JSON object"):
        read_trial_overrides({ENV_OVERRIDES: "[1]"})
    with pytest.raises(TrialProtocolError, match="ZERORUN_TRIAL_STEPS"):
        TrialSpec.from_env({**spec.env(), "ZERORUN_TRIAL_STEPS": "0"})
    assert ENV_RESULT in spec.env()


def test_recorder_counts_steps_with_a_fake_clock(tmp_path: Path) -> None:
    ticks = iter([0.0, 1.0, 2.0, 2.5, 3.5, 4.0])
    exits: list[int] = []
    spec = TrialSpec({}, warmup=1, steps=4, result_path=tmp_path / "r.json")
    rec = TrialRecorder(spec, samples_per_step=2, clock=lambda: next(ticks), exit=exits.append)
    done = [rec.step_done() for _ in range(5)]
    assert done == [False, False, False, False, True] and exits == [0]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["step_times_s"] == [1.0, 0.5, 1.0, 0.5]
    assert result["median_step_s"] == 0.75 and result["samples_per_s"] == pytest.approx(2 / 0.75)


def test_only_rank_zero_writes_the_result(tmp_path: Path) -> None:
    spec = TrialSpec({}, warmup=0, steps=1, result_path=tmp_path / "r.json")
    exits: list[int] = []
    TrialRecorder(spec, rank=1, exit=exits.append).step_done()
    assert exits == [0] and not (tmp_path / "r.json").exists()


def test_oom_detection_by_type() -> None:
    class OutOfMemoryError(RuntimeError):  # the name torch.cuda.OutOfMemoryError has
        pass

    assert is_out_of_memory(OutOfMemoryError("CUDA"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("CUDA out of memory"))  # text alone never decides
