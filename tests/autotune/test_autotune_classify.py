"""Trial outcomes from exit codes and result files, never from output text."""

from __future__ import annotations

import json
from pathlib import Path

from zerorun.autotune.classify import Outcome, classify


def _write(path: Path, **data: object) -> None:
    path.write_text(json.dumps({"median_step_s": None, "samples_per_s": None, "peak_bytes": None, "error": None, "rank": 0, **data}))


def test_finished_needs_a_result_and_exit_zero(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    _write(result, status="ok", median_step_s=0.5, samples_per_s=16.0, peak_bytes=10)
    assert classify(0, result).status is Outcome.FINISHED
    late = classify(-9, result)
    assert late.status is Outcome.CRASH and "SIGKILL" in late.reason


def test_timeout_wins_over_everything(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    _write(result, status="ok", samples_per_s=1.0)
    assert classify(None, result, timed_out=True).status is Outcome.TIMEOUT


def test_any_rank_oom_is_oom(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    _write(tmp_path / "r.json.rank0", status="error", error="ValueError: x")
    _write(tmp_path / "r.json.rank3", status="oom", error="OutOfMemoryError: CUDA", rank=3, peak_bytes=99)
    outcome = classify(1, result)
    assert outcome.status is Outcome.OOM and outcome.reason.startswith("rank 3") and outcome.peak_bytes == 99


def test_no_result(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    clean = classify(0, result)
    assert clean.status is Outcome.CRASH and "without a result" in clean.reason
    assert "SIGSEGV" in classify(139, result).reason
    assert "exit code 2" in classify(2, result).reason


def test_torn_result_file_is_no_result(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    result.write_text('{"status": "o')
    assert classify(0, result).status is Outcome.CRASH
