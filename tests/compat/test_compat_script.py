"""A DeepSpeed-style script runs with zero edits under ``zerorun --as_deepspeed`` and matches
a single-process reference step by step (2 gloo ranks, stages 1 and 3).

The script (tests/compat_scripts/ds_classifier.py) declares its own --local_rank, calls
deepspeed.add_config_arguments, init_distributed, initialize(args=...), get_accelerator,
deepspeed.comm and zero.GatheredParameters. The config has no gradient_clipping (DeepSpeed's
default 1.0 applies) and a WarmupLR schedule, so the reference clips at 1.0 and uses
DeepSpeed's lr for each step (the first at warmup_min_lr).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from zerorun.compat import SITEDIR

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "compat_scripts" / "ds_classifier.py"
LR, WARMUP = 0.05, 3


def _config(stage: int) -> dict:
    return {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                         "warmup_num_steps": WARMUP, "warmup_type": "linear"}},
            "zero_optimization": {"stage": stage}}


def _deepspeed_lr(step: int) -> float:
    """DeepSpeed 0.19.8: optimizer step k runs at warmup_min_lr for k = 0, else at the formula of k - 1."""
    return 0.0 if step == 0 else LR * min(1.0, (step - 1) / WARMUP)


def _reference() -> tuple[list[float], list[list[float]]]:
    sys.path[:0] = [str(SCRIPT.parent), str(SITEDIR)]  # the script imports deepspeed at its top
    try:
        import ds_classifier as script  # the same model and data, in one process
    finally:
        del sys.path[:2]
        for name in [n for n in sys.modules if n == "deepspeed" or n.startswith(("deepspeed.", "ds_classifier"))]:
            del sys.modules[name]
    torch.manual_seed(0)
    net = script.Net()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.01)
    losses = []
    for step in range(script.STEPS):
        for g in opt.param_groups:
            g["lr"] = _deepspeed_lr(step)
        x, y = script.batch(step)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().flatten().tolist() for p in net.parameters()]


@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_script_runs_unchanged_and_matches_reference(tmp_path: Path, stage: int) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(_config(stage)))
    env = {k: v for k, v in os.environ.items() if k not in ("ZERORUN_AS_DEEPSPEED", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "zerorun.cli", "--as_deepspeed", "--num_gpus", "2", "--master_port", "auto",
            str(SCRIPT), "--deepspeed", "--deepspeed_config", "ds.json", "--out", "result.json"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads((tmp_path / "result.json").read_text())
    assert (got["stage"], got["device"], got["local_rank_flag"]) == (stage, "cpu", 0)
    ref_losses, ref_params = _reference()
    assert got["losses"] == pytest.approx(ref_losses, rel=1e-5)
    for a, b in zip(got["params"], ref_params, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    assert got["lr"] == pytest.approx([_deepspeed_lr(4)])
