"""Run an unmodified DeepSpeed script under ``zerorun --as-deepspeed`` (imported by tests/scripts/test_ds_scripts*.py).

Each script writes ``losses_rank{r}.json`` (or, for the Trainer, ``log_history.json``) to
the directory it is given; the launch has a hard timeout, its output goes to SCRIPT.log in
the run's directory and its tail into the failure message.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from launcher_conftest import zerorun_argv

SCRIPTS = Path(__file__).parent / "ds_scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config, indent=2))
    return path


def launch(script: str, *script_args: str, cwd: Path, world: int = 2, timeout: float = 150,
           env: dict[str, str] | None = None) -> str:
    """``zerorun --as-deepspeed --num_gpus WORLD SCRIPT ARGS`` in ``cwd``; returns its output, fails on rc != 0.
    ``env``: variables over ``ENV``."""
    argv = zerorun_argv("--as-deepspeed", "--num_gpus", str(world), "--master_port", "auto",
                        str(SCRIPTS / script), *script_args)
    proc = subprocess.run(argv, cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    (cwd / f"{Path(script).stem}.log").write_text(output)  # the whole run, for a failure's post-mortem
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{output[-6000:]}"
    return output


def rank_losses(out_dir: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out_dir / f"losses_rank{r}.json").read_text()) for r in range(world)]


def mean_over_ranks(per_rank: list[list[float]]) -> list[float]:
    """The global-batch loss of each step: the mean of the ranks' micro-batch losses."""
    return [sum(values) / len(values) for values in zip(*per_rank, strict=True)]
