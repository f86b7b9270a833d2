"""Under zero.Init, a parent constructor that re-initializes a child's (already sharded) parameter
writes it for real (``nn.MultiheadAttention`` zeroes ``out_proj.bias`` this way): the child is
gathered for the rest of that constructor and rank 0's values become every rank's shards. After
the constructors, the same write outside forward/backward gets the clear error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.child_output import own_words

SCRIPT = textwrap.dedent("""
    import torch, zerorun
    from torch import nn
    from zerorun.engine.mechanism.guard import ShardedParameterError

    cfg = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            nn.init.constant_(self.emb.weight, 0.5)  # the child is sharded by now

    with zerorun.zero.Init(config=cfg):
        model = Parent()
    assert model.emb.weight.numel() == 0, "the child must be sharded again after the constructor"
    with zerorun.zero.GatheredParameters([model.emb.weight]):
        assert bool((model.emb.weight == 0.5).all()), model.emb.weight
    print("written")
    try:
        nn.init.normal_(model.emb.weight, std=0.02)
    except ShardedParameterError as err:
        assert "GatheredParameters" in str(err), err
        print("raised")
""")


def test_a_parent_constructor_writes_a_sharded_child_and_later_writes_raise() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "ZERORUN_CONFIG")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert own_words(out.stdout) == ["written", "raised"], out.stdout + out.stderr[-3000:]
