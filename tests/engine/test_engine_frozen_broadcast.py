"""Every rank starts from rank 0's frozen parameters, at every stage (DeepSpeed's initialize broadcasts every
parameter; zerorun's stages 0-2 broadcast only the buckets, so a frozen layer each rank initialized
differently stayed different: the ranks trained different models and a checkpoint held rank 0's alone).

World 2, each rank seeds its own initialization; the frozen layer includes a non-contiguous parameter and a
0-dim one. After ``initialize`` every parameter equals rank 0's; buffers are left alone, as DeepSpeed leaves them.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.dist_harness import run_distributed


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(4, 6)
        self.frozen.weight = nn.Parameter(torch.randn(4, 6).t())  # non-contiguous
        self.scale = nn.Parameter(torch.randn(()))  # 0-dim
        self.head = nn.Linear(6, 2)
        self.register_buffer("seen", torch.randn(3))
        for p in (*self.frozen.parameters(), self.scale):
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(x) * self.scale)


def _rank(rank: int, world: int, stage: int) -> dict[str, torch.Tensor]:
    import zerorun

    torch.manual_seed(100 + rank)  # a different initialization on each rank
    model = Model()
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    engine = zerorun.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                config=cfg)[0]
    with zerorun.zero.GatheredParameters(list(engine.module.parameters())):
        state = {n: t.detach().float().clone() for n, t in engine.module.state_dict().items()}
    engine.destroy()
    return state


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_rank_starts_from_rank_0s_parameters(stage: int) -> None:
    first, second = run_distributed(_rank, 2, stage, timeout=240)
    for name in first:
        if name == "seen":  # a buffer: each rank's own, as in DeepSpeed
            assert not torch.equal(first[name], second[name])
        else:
            torch.testing.assert_close(second[name], first[name], rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
