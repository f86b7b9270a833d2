"""Under zero.Init, a parent constructor that re-initializes a child's (already sharded)
parameter gets the clear error, never a silent no-op on the empty placeholder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, zerorun
    from torch import nn
    from zerorun.engine.sharded_param import ShardedParameterError

    cfg = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            nn.init.normal_(self.emb.weight, std=0.02)  # the child is sharded by now

    try:
        with zerorun.zero.Init(config=cfg):
            Parent()
    except ShardedParameterError as err:
        assert "GatheredParameters" in str(err), err
        print("raised")
""")


def test_writing_a_sharded_parameter_in_a_parent_constructor_raises() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "ZERORUN_CONFIG")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("raised"), out.stdout + out.stderr[-3000:]
