"""The second hour's small things: the toy's one progress line, card names for --gpu-memory, help and
tables that wrap once, the README's extra packages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_the_toy_prints_one_progress_line_per_step_that_agrees_with_the_engines() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    out = subprocess.run([sys.executable, "examples/train_toy.py", "--config", "templates/zero2.yaml", "--steps", "10",
                          "--hidden", "8", "--layers", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    losses = [line for line in out.stdout.splitlines() if "loss" in line]
    assert len(losses) == 2 and losses[0].startswith("[zerorun] step 10 | loss "), out.stdout  # engine's, final
    engine_loss = losses[0].split("| loss ")[1].split()[0]
    assert losses[1].startswith("loss: ") and f"-> {engine_loss} in step 10" in losses[1], out.stdout


@pytest.mark.parametrize(("text", "gib"), [("3090", 24.0), ("4090", 23.99), ("a100-40", 40.0), ("A100-80", 80.0),
                                           ("h100", 79.65), ("h200", 140.4), ("l40s", 44.99), ("MI300X", 191.98),
                                           ("24GB", 24.0), ("24 GB", 24.0), ("24G", 24.0), ("24", 24.0),
                                           ("24GiB", 24.0), ("24000MB", 22.35)])
def test_gpu_memory_is_the_card_as_users_type_it(text: str, gib: float) -> None:
    from zerorun.estimate import parse_gpu_memory

    assert parse_gpu_memory(text) / 2**30 == pytest.approx(gib, abs=0.01)


def test_the_estimate_says_how_it_read_gpu_memory(capsys: pytest.CaptureFixture[str]) -> None:
    from zerorun.cli import main

    assert main(["estimate", "--params", "1B", "--gpu-memory", "24GB"]) == 0
    assert "note: --gpu-memory 24GB: 24.0 GiB per GPU (GB as on a card's label, which means GiB" in capsys.readouterr().out
    assert main(["estimate", "--params", "1B", "--gpu-memory", "h100"]) == 0
    assert "79.6 GiB per GPU, the h100's total as its driver reports it" in capsys.readouterr().out
    assert main(["estimate", "--params", "1B", "--gpu-memory", "h1000"]) == 1
    assert "a card (3090, 4090, a100-40, a100-80, h100, h200, l40s, mi300x)" in capsys.readouterr().err


def test_help_paragraphs_wrap_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from zerorun.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # wide: a paragraph is one line, whatever the docstring's breaks
    assert main(["simulate", "--help"]) == 0
    assert "every collective keeps its shapes and byte counts, not its values. Printed beside" in capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["simulate", "--help"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "keeps" not in lines and "for" not in lines and "step" not in lines  # no one-word leftovers


def test_off_a_terminal_help_and_tables_are_100_columns(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.args import build_parser
    from zerorun.cli import main
    from zerorun.commands.console import console
    from zerorun.width import output_width

    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_width() == 100 and console().width == 100 and console(stderr=True).width == 100
    assert main(["estimate", "--help"]) == 0
    widths = [len(line) for line in capsys.readouterr().out.splitlines()]
    assert 80 < max(widths) <= 100, widths
    text = build_parser().format_help()
    assert "Every flag takes - or _ alike" in text and max(len(line) for line in text.splitlines()) <= 100
    assert max(len(line) for line in text.split("Examples:")[0].splitlines()) > 80  # laid out for 100, not 80
    monkeypatch.setenv("COLUMNS", "120")
    assert output_width() == 120 and console().width == 120


def test_the_autotune_dry_run_table_is_not_cut_off_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from zerorun.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text('{"train_batch_size": 8, "zero_optimization": {"stage": 2}}')
    (tmp_path / "t.py").write_text("pass\n")
    assert main(["autotune", "--num_gpus", "2", "--config", "ds.json", "--dry-run", "t.py"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 100, out


def test_autotunes_eight_column_results_fit_off_a_terminal(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from rich.table import Table

    from zerorun.commands.console import console

    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table()
    names = ("#", "knobs (vs start)", "samples/s", "spread", "median step", "peak memory", "status", "why")
    for name in names:  # zerorun.autotune.display.results_table's columns, its knobs column as wide
        table.add_column(name, overflow="fold", min_width=24 if name.startswith("knobs") else None)
    table.add_row("1", "reduce_bucket_size=1.25e+08", "1234.56", "1.2%", "45.6 ms", "12.3 GiB", "finished", "winner")
    console().print(table)
    out = capsys.readouterr().out
    assert all(name in out for name in names), out  # at rich's 80 columns: `statu`


def test_simulate_says_why_its_buffers_differ_from_the_estimates() -> None:
    from types import SimpleNamespace

    from zerorun.simulate.compare import STATE_TERMS
    from zerorun.simulate.report import _memory_lines

    memory = {**{t: 1 << 20 for t in STATE_TERMS}, "buffers": 2 * 10**9}
    result = SimpleNamespace(memory=memory, forward_params=0, stage=2, kept_numel=None)
    comparison = SimpleNamespace(states={t: 1 << 20 for t in STATE_TERMS}, bound=0, total=5 << 30, window=None, placed=None,
                                 buffers={"reduce_staging": 1000 << 20})
    lines = _memory_lines(result, comparison)  # type: ignore[arg-type]
    text = "\n".join(lines)
    assert "1.86 GiB" in text and "1000.00 MiB" in text and "buffers differ by design" in text
    assert "one reduce_bucket_size buffer, two with" in text and max(len(line) for line in lines) <= 80


def test_the_readme_names_the_extra_packages_the_tools_ask_for() -> None:
    import tomllib

    readme = (ROOT / "README.md").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, tool in (("safetensors", "model.safetensors"), ("plot", "estimate --plot")):
        assert extra in extras and f"pip install -e '.[{extra}]'" in readme, extra
        assert tool in readme.split("**Extra packages.**", 1)[1].split("\n\n", 1)[0], tool
    assert "`zerorun simulate --model config.json`" in readme and "pip install transformers" in readme
    hints = [(ROOT / "zerorun" / p).read_text() for p in ("simulate/model.py", "engine/checkpoint/consolidate.py",
                                                          "estimate/plot.py")]
    assert "transformers" in hints[0] and "zerorun[safetensors]" in hints[1] and "zerorun[plot]" in hints[2]


def test_the_readme_says_what_a_second_job_and_a_misplaced_option_do() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "**A second job on the same machine**" in readme and "takes 29500 when it\nis free, else a free port" in readme
    assert "**A launcher option after the script**" in readme
