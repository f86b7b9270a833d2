"""Every subcommand with wrong input, as a newcomer types it: one ``error:`` line, exit 2 for
a usage error and 1 for bad input, never a traceback; under ``--json`` the error is JSON.

Runs in-process through ``zerorun.cli.main`` (an escaping exception fails the test the
way a traceback would fail the user), plus the real console entry point once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zerorun.cli import main

USAGE, BAD_INPUT = 2, 1


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    (tmp_path / "t.py").write_text("print('ran')\n")
    (tmp_path / "ok.yaml").write_text("train_batch_size: 8\nzero_optimization: {stage: 2}\n")
    (tmp_path / "latin1.json").write_bytes(b'{"train_batch_size": 4, "x": "\xe9t\xe9"}')
    (tmp_path / "bad_opt.json").write_text(json.dumps(
        {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_dacay": 0.1}}}))
    (tmp_path / "hostdir").mkdir()
    return tmp_path


CASES: list[tuple[list[str], int, str]] = [
    # usage errors: exit 2
    (["validate"], USAGE, "Missing argument"),
    (["validate", "--bogus", "ok.yaml"], USAGE, "--bogus"),
    (["print-config", "--format", "xml", "ok.yaml"], USAGE, "--format"),
    (["estimate", "--dtype", "fp8"], USAGE, "fp8"),
    (["estimate", "--gpus", "0", "--params", "1B"], USAGE, "--gpus"),
    (["report", "--bogus"], USAGE, "--bogus"),
    (["convert"], USAGE, "Missing argument"),
    (["autotune", "t.py"], USAGE, "needs --config"),
    (["autotune", "--config", "ok.yaml", "--bogus", "t.py"], USAGE, "--bogus"),
    (["autotune", "--config", "ok.yaml", "t.py", "--dry-run"], USAGE, "--dry-run comes after SCRIPT"),
    (["launch", "--num-gpu", "2", "t.py"], USAGE, "--num-gpu"),
    (["--num_gpus", "x", "t.py"], USAGE, "invalid int value"),
    (["estimat", "--params", "1B"], USAGE, "did you mean `zerorun estimate`"),
    (["valdate", "ok.yaml"], USAGE, "did you mean `zerorun validate`"),
    # bad input: exit 1
    (["validate", "missing.json"], BAD_INPUT, "invalid"),
    (["validate", "latin1.json"], BAD_INPUT, "invalid"),
    (["validate", "bad_opt.json"], BAD_INPUT, "invalid"),
    (["print-config", "missing.json"], BAD_INPUT, "no such file"),
    (["estimate", "--params", "many"], BAD_INPUT, "cannot read the parameter count"),
    (["estimate", "--params", "1B", "--gpu-memory", "0.01"], BAD_INPUT, "not the memory of one GPU"),
    (["estimate", "--params", "1B", "--gpu-memory", "80 parsecs"], BAD_INPUT, "cannot read the size"),
    (["estimate", "--measure", "missing.py"], BAD_INPUT, "not a file"),
    (["convert", "no_such_dir", "out.pt"], BAD_INPUT, "no_such_dir"),
    (["autotune", "--config", "missing.yaml", "t.py"], BAD_INPUT, "missing.yaml"),
    (["autotune", "--config", "ok.yaml", "--knobs", "contiguous_gradients", "t.py"], BAD_INPUT, "does not read"),
    (["launch", "missing.py"], BAD_INPUT, "is not a file"),
    (["--hostfile", "hostdir", "t.py"], BAD_INPUT, "is a directory"),
    (["--num_gpus", "2", "t.py", "--deepspeed_config=missing.json"], BAD_INPUT, "does not exist"),
    (["--num_gpus", "2", "t.py", "--config", "latin1.json"], BAD_INPUT, "not UTF-8"),
]


@pytest.mark.parametrize(("argv", "code", "needle"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_wrong_input_is_one_error_line(argv: list[str], code: int, needle: str, files: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == code
    out, err = capsys.readouterr()
    text = out + err
    assert "Traceback" not in text
    assert needle in text, text
    if code == USAGE:
        assert [line for line in err.splitlines() if line.startswith("error:")] != [], err
        assert err.splitlines()[0].startswith("usage: "), err  # the usage, then the one error line
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err
    assert "ran" not in out  # nothing was launched


JSON_CASES: list[tuple[list[str], int]] = [
    (["validate", "missing.json", "--json"], BAD_INPUT),
    (["print-config", "--json", "missing.json"], BAD_INPUT),
    (["estimate", "--json", "--dtype", "fp8"], USAGE),
    (["estimate", "--json", "--params", "many"], BAD_INPUT),
    (["report", "--json", "--bogus"], USAGE),
    (["autotune", "--json", "t.py"], USAGE),
    (["--dry-run", "--json", "--num-gpu", "2", "t.py"], USAGE),
    (["launch", "--dry-run", "--json", "--config", "missing.yaml", "t.py"], BAD_INPUT),
]


@pytest.mark.parametrize(("argv", "code"), JSON_CASES, ids=[" ".join(c[0]) for c in JSON_CASES])
def test_errors_under_json_are_json(argv: list[str], code: int, files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == code
    out, err = capsys.readouterr()
    data = json.loads(out)  # the whole of stdout is one JSON document
    assert "Traceback" not in out + err
    if "files" in data:  # validate --json: the per-file results, machine-readable
        assert data["ok"] is False and data["files"][0]["problems"]
    else:
        assert data["exit_code"] == code and data["error"] and "hint" in data


REPORTING = ["validate", "print-config", "estimate", "report", "autotune", "launch"]


@pytest.mark.parametrize("name", [*REPORTING, "convert"])
def test_every_help_has_examples_and_reporting_commands_take_json(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "-h"]) == 0
    out = capsys.readouterr().out
    assert "Examples:" in out, out
    assert f"zerorun {name}" in out or name == "launch"  # an example of this very command
    if name in REPORTING:
        assert "--json" in out, out


def test_both_spellings_and_one_world_size_option(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--world-size", "--world_size", "--num-gpus", "--num_gpus", "--gpus", "-w"):
        assert main(["validate", "ok.yaml", flag, "4"]) == 0, flag
        assert "batch 8 = 2 x 1 x 4 ranks" in capsys.readouterr().out, flag
    assert main(["validate", "ok.yaml", "--gpus", "2", "--nodes", "2", "--json"]) == 0
    assert "4 ranks" in json.loads(capsys.readouterr().out)["files"][0]["summary"]
    for spelling in (["--num-gpus", "2"], ["--num_gpus", "2"], ["--dry_run"], ["--dry-run"]):
        argv = [*spelling, *(["--dry-run"] if "dry" not in spelling[0] else []), "--json", "t.py"]
        assert main(argv) == 0, argv
        assert json.loads(capsys.readouterr().out)["world_size"] in (1, 2)


def test_validate_checks_the_optimizer_against_torch(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "bad_opt.json"]) == BAD_INPUT
    out = capsys.readouterr().out
    assert "weight_dacay: is not a parameter of torch.optim.AdamW (did you mean weight_decay?)" in out


def test_validate_takes_a_schedules_per_group_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSpeed's schedules take one lr (or momentum) per parameter group, as the engine does."""
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": [0.0, 1e-5], "warmup_num_steps": 10}}}
    (tmp_path / "groups.json").write_text(json.dumps(cfg))
    assert main(["validate", str(tmp_path / "groups.json")]) == 0, capsys.readouterr().out
    cfg["scheduler"]["params"]["warmup_min_lr"] = ["0.0"]  # not numbers: still refused
    (tmp_path / "groups.json").write_text(json.dumps(cfg))
    assert main(["validate", str(tmp_path / "groups.json")]) == BAD_INPUT
    assert "warmup_min_lr: WarmupLR takes int or float here, got list" in capsys.readouterr().out


def test_the_console_script_never_prints_a_traceback(files: Path) -> None:
    for argv, code in ((["-h"], 0), (["validate"], USAGE), (["print-config", "--json", "missing.json"], BAD_INPUT),
                       (["estimate", "--dtype", "fp8"], USAGE)):
        proc = subprocess.run([sys.executable, "-m", "zerorun.cli", *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, (argv, proc.stderr)
        assert "Traceback" not in proc.stdout + proc.stderr, argv
