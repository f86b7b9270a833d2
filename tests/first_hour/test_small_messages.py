"""The issue's small rows, each in process: bare `zerorun`, "did you mean" for a script,
two configs for one run, `--as_deepspeed` for a missing deepspeed, rank colours, and the
file `print-config -o` writes. Each failed on 9b6a4ae."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from launcher.run.output import OutputSink
from launcher.script_path import missing_script
from launcher.watch.report import Failure, format_report
from zerorun.cli import main
from zerorun.engine.api import resolve_config_source
from zerorun.engine.errors import EngineError


def test_bare_zerorun_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "Usage" in capsys.readouterr().out


def test_a_misspelt_script_gets_did_you_mean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train_toy.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert "did you mean examples/train_toy.py?" in str(missing_script("examples/train_tyo.py"))
    assert "did you mean examples/train_toy.py?" in str(missing_script("exampels/train_toy.py"))
    assert "did you mean" not in str(missing_script("elsewhere.py"))


def test_two_configs_for_one_run_are_an_error_naming_both(tmp_path: Path) -> None:
    args = argparse.Namespace(deepspeed_config="other.json")
    with pytest.raises(EngineError, match=r"initialize\(config='mine.json'\) and --deepspeed_config 'other.json'"):
        resolve_config_source("mine.json", args)
    with pytest.raises(EngineError, match="initialize.config=a dict"):
        resolve_config_source({"train_batch_size": 4}, args)
    assert resolve_config_source("other.json", args) == "other.json"  # the same file twice is one config


def test_a_missing_deepspeed_suggests_as_deepspeed() -> None:
    tail = ("Traceback (most recent call last):", "    import deepspeed",
            "ModuleNotFoundError: No module named 'deepspeed'")
    box = format_report([Failure("h", 0, 1, 0.0, rank=0, local_rank=0, stderr_tail=tail)], 2)
    assert "zerorun --as_deepspeed" in box


def test_rank_colours_do_not_read_as_errors_or_warnings() -> None:
    sink = OutputSink("h", io.BytesIO(), io.BytesIO(), color=True)
    codes = {sink.prefix(rank).split(b"m", 1)[0] for rank in range(64)}
    assert not codes & {b"\x1b[31", b"\x1b[91", b"\x1b[33", b"\x1b[93"}, codes


def test_print_config_says_where_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds3.yaml"
    assert main(["print-config", "--template", "zero3", "-o", str(out)]) == 0
    assert out.is_file() and str(out) in capsys.readouterr().err
