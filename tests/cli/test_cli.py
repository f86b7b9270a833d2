"""The CLI's routing: subcommands go to the tool app, anything else is a launch."""

from __future__ import annotations

import subprocess
import sys

from zerorun.cli import main, route


def test_subcommand_routes_to_app() -> None:
    assert route(["validate", "x.yaml"]) == ("app", ["validate", "x.yaml"])
    assert route(["--help"])[0] == "app"


def test_script_or_launcher_option_routes_to_launch() -> None:
    assert route(["train.py", "--lr", "1"])[0] == "launch"
    assert route(["--num_gpus", "2", "train.py"])[0] == "launch"


def test_help_lists_every_subcommand(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("validate", "print-config", "estimate", "autotune", "report", "launch"):
        assert name in out


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "zerorun.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("zerorun ")


def test_exit_code_of_a_subcommand_is_kept(tmp_path) -> None:
    # `zerorun launch` ends with typer.Exit(code); the code must reach the shell, not turn into 0.
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(3)\n")
    assert main(["launch", str(script)]) == 3
