"""`zerorun autotune` through the CLI's entry point, without running trials."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zerorun.cli import main


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                    "zero_optimization": {"stage": 2}}))
    return path


def test_dry_run_lists_candidates_and_pruned_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    code = main(["autotune", "--num_gpus", "2", "--config", str(_config(tmp_path)), "--dry-run", "--params", "1.3B",
                 "--gpu-memory", "16GiB", "--knobs", "reduce_bucket_size", "train.py"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "round-1 candidates" in captured.out and "would run" in captured.out
    assert "pruned: predicted" in captured.out  # the 8e9-element bucket cannot fit 16 GiB in fp32
    assert "reduce_bucket_size: start 500000000" in captured.err
    assert not (tmp_path / "autotune").exists()  # nothing ran, nothing written


def test_errors_come_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autotune", "--num_gpus", "2", "train.py"]) == 2  # a usage error
    assert "needs --config" in capsys.readouterr().err
    code = main(["autotune", "--config", str(_config(tmp_path)), "--knobs", "stage3_max_live_parameters", "t.py"])
    err = capsys.readouterr().err
    assert code == 1 and "not tuned at stage 2" in err and "hint:" in err
    code = main(["autotune", "--config", str(_config(tmp_path)), "--knobs", "allgather_bucket_size", "t.py"])
    err = capsys.readouterr().err
    assert code == 1 and "does not read it at stage 2" in err  # never tune what the engine ignores


def test_help_shows_launcher_and_autotune_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autotune", "-h"]) == 0
    out = capsys.readouterr().out
    assert "--trial-steps" in out and "--num_gpus" in out and "--hostfile" in out
