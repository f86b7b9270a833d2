"""`validate` reports every problem in one pass: the optimizer's params (a str lr, a float
betas) beside the schema's problems, where before they appeared only once the schema's
problems were fixed (the issue's 9-problem file showed 6, then 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerorun.cli import main

NINE = {"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 4, "overlap_com": True, "reduce_bucket_size": -1},
        "optimizer": {"type": "AdamW", "params": {"lr": "fast", "betas": 0.9}},
        "fp16": {"enabled": True}, "bf16": {"enabled": True}, "steps_per_prin": 3, "gradient_clipping": "x"}


def test_nine_problems_in_one_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nine.json"
    path.write_text(json.dumps(NINE))
    assert main(["validate", str(path), "--world-size", "8"]) == 1
    out = capsys.readouterr().out
    assert "invalid (9 problems)" in out, out
    for key in ("optimizer.params.lr", "optimizer.params.betas", "fp16.enabled", "zero_optimization.stage",
                "zero_optimization.overlap_com", "steps_per_prin", "gradient_clipping",
                "zero_optimization.reduce_bucket_size", "train_batch_size"):
        assert f"nine.json: {key}:" in out, (key, out)
