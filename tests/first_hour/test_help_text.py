"""Help a newcomer can copy from: at 80 columns every option's name is whole (rich's panel cut
`--offload-optim…` in `estimate --help`), and `autotune --help` describes autotune's own
--dry-run and --json (it showed the launcher's: "print the rank table and the per-node
commands"). Both failed on 9b6a4ae."""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
import typer

from zerorun.cli import app, main

TYPER_COMMANDS = ["estimate", "validate", "print-config", "convert", "simulate", "report", "doctor", "elastic",
                  "link-deepspeed"]


@functools.cache
def _params(name: str) -> list[Any]:
    return typer.main.get_command(app).commands[name].params


@pytest.mark.parametrize("name", TYPER_COMMANDS)
@pytest.mark.parametrize("width", ["80", "200"])
def test_every_option_name_is_whole(name: str, width: str, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", width)
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and "Examples:" in out, out
    for param in _params(name):
        for opt in (o for o in (*param.opts, *param.secondary_opts) if o.startswith("-")):
            assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", out), (opt, out)
    assert all(len(line) <= int(width) for line in out.splitlines()), out
    assert "\\[" not in out  # rich's escapes never reach the plain list


def test_a_wide_terminal_keeps_the_panels(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["estimate", "--help"]) == 0
    assert "╭─" in capsys.readouterr().out


def test_autotune_help_describes_its_own_dry_run(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["autotune", "--dry-run", "--help"]) == 0
    out = capsys.readouterr().out
    own = out.split("\nautotune:\n", 1)[1]
    assert "--dry-run, --dry_run  print the search space and round 1's candidates" in own, out
    assert "--json                print the ranked trials" in own, out
    assert "print the rank table" not in out, out
    assert main(["launch", "--help"]) == 0  # the launcher's own help is unchanged
    assert "print the rank table and the per-node commands" in capsys.readouterr().out
