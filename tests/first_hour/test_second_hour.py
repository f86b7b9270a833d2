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
