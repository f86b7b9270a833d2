"""Docs that match the tool: the README's estimate figure is the tool's, each template's
"Per rank" formula is the estimate's arithmetic for its stage, a key the engine never
reads says so in every template comment and in `print-config --docs` (one source,
config/noop.py). Before: README 54.1 vs tool 54.3, zero2 "2P + 14P/N", --docs describing
contiguous_gradients as doing what noop.py says it does not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from template_lines import key_lines

from zerorun.config import keys
from zerorun.config.noop import NO_EFFECT
from zerorun.estimate.memory_model import EstimateRequest, estimate, usable_bytes
from zerorun.estimate.model_states import Dtype, Optimizer, Placement, Training, model_states

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((ROOT / "templates").glob("*.yaml"))


def test_the_readme_estimate_figure_is_the_tools() -> None:
    gpu = 80 * 2**30  # --gpu-memory 80GB: an "80 GB" card's 80 GiB (zerorun.estimate.cards)
    est = estimate(EstimateRequest(Training(14 * 10**9, 8, Dtype.BF16, Optimizer.ADAM), 8, gpu_memory=gpu))
    row = est.recommendation.row
    assert row is not None
    said = f"it recommends stage {row.placement.stage} ({row.total / 2**30:.1f} of {usable_bytes(gpu) / 2**30:.1f} usable GiB per GPU)"
    assert said in (ROOT / "README.md").read_text(), said


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_template_formula_and_no_effect_comments(path: Path) -> None:
    text = path.read_text()
    found = re.search(r"Per rank: (?:(\d+)P \+ )?(\d+)P/N bytes", text)
    if found:
        stage = int(re.search(r"^\s+stage: (\d)", text, re.M).group(1))
        full, per_n = int(found.group(1) or 0), int(found.group(2))
        p, n = 1000 * 8, 8
        states = model_states(Training(p, n, Dtype.BF16, Optimizer.ADAM), Placement(stage))
        assert sum(states.gpu.values()) == full * p + per_n * p // n, (path.name, states.gpu)
    for _, key, comment in key_lines(text):
        if key in NO_EFFECT:
            assert comment == f"no effect here: {NO_EFFECT[key]}", (path.name, key, comment)


def test_print_config_docs_say_a_no_op_key_has_no_effect() -> None:
    for key, why in NO_EFFECT.items():
        assert keys.description(key) == f"Accepted for DeepSpeed's configs; no effect here: {why}.", key


def test_the_estimate_doc_shows_the_tools_output(capsys: pytest.CaptureFixture[str]) -> None:
    from zerorun.cli import main

    command = "zerorun estimate --params 14B --gpus 8 --gpu-memory 80GB"
    assert main(command.split()[1:]) == 0
    out = "\n".join(line.rstrip() for line in capsys.readouterr().out.splitlines())
    doc = (ROOT / "docs" / "estimate.md").read_text()
    block = doc.split(f"$ {command}\n", 1)[1].split("```", 1)[0].rstrip("\n")
    assert block == out, "docs/estimate.md's example is not the tool's output: regenerate it"
