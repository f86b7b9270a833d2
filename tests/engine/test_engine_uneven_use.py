"""Parameters that only some ranks, steps or micro-steps use (data-dependent routing, as in MoE).

Each rank routes its micro-batch through expert ``a`` or ``b`` by (step, micro-step, rank),
so in one step an expert's gradient exists on one rank and not the other, and a third
expert is used once, by rank 0 at step 0, then never again. The reduced gradient of an
expert must be its gradient on the ranks that used it, averaged over all ranks: a buffer
slot left over from an earlier step must count as zero, not be summed in. The reference
is one process summing every rank's routed loss (mean over ranks and micro-steps).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.dist_harness import run_distributed

WORLD, STEPS, ROWS, DIM = 2, 4, 3, 5


class Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.inp = nn.Linear(DIM, DIM)
        self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(3))

    def forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        return self.experts[expert](torch.tanh(self.inp(x)))


def route(step: int, micro: int, rank: int) -> int:
    if (step, micro, rank) == (0, 0, 0):
        return 2  # used once, by one rank, then its slot must read zero on every later step
    return (step + micro + rank) % 2


def batch(step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + 10 * micro + rank)
    return torch.randn(ROWS, DIM, generator=g), torch.randn(ROWS, DIM, generator=g)


def optimizer(params, name: str) -> torch.optim.Optimizer:
    if name == "SGD":  # momentum keeps a stale gradient visible in every later step
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01)


CASES = [(stage, gas, opt) for stage in (0, 1, 2) for gas in (1, 2) for opt in ("SGD", "AdamW")]


def _train(rank: int, world: int) -> dict:
    import zerorun

    out = {}
    for stage, gas, opt in CASES:
        model = Routed()
        config = {"train_micro_batch_size_per_gpu": ROWS, "gradient_accumulation_steps": gas,
                  "gradient_clipping": 0.0, "steps_per_print": 10**6,
                  "zero_optimization": {"stage": stage, "reduce_bucket_size": 40}}
        engine, _, _, _ = zerorun.initialize(model=model, optimizer=optimizer(model.parameters(), opt),
                                             config=config)
        for step in range(STEPS):
            for micro in range(gas):
                x, y = batch(step, micro, rank)
                engine.backward(nn.functional.mse_loss(engine(x, route(step, micro, rank)), y))
                engine.step()
        out[(stage, gas, opt)] = [p.detach().clone() for p in model.parameters()]
    return out


def _reference(gas: int, opt: str) -> list[torch.Tensor]:
    model = Routed()
    o = optimizer(model.parameters(), opt)
    for step in range(STEPS):
        o.zero_grad()
        loss = sum(nn.functional.mse_loss(model(x, route(step, micro, rank)), y)
                   for micro in range(gas) for rank in range(WORLD)
                   for x, y in [batch(step, micro, rank)])
        (loss / (gas * WORLD)).backward()
        for p in model.parameters():  # an expert no rank used is stepped with a zero gradient (a flat
            if p.grad is None:        # bucket is stepped whole, as DeepSpeed's partitions are)
                p.grad = torch.zeros_like(p)
        o.step()
    return [p.detach() for p in model.parameters()]


@pytest.fixture(scope="module")
def per_rank() -> list[dict]:
    return run_distributed(_train, WORLD, timeout=180)


@pytest.mark.parametrize("case", CASES, ids=[f"stage{s}-gas{g}-{o}" for s, g, o in CASES])
def test_routed_experts_match_one_process(per_rank: list[dict], case: tuple[int, int, str]) -> None:
    want = _reference(case[1], case[2])
    for rank, got in enumerate(r[case] for r in per_rank):
        for name, g, w in zip([n for n, _ in Routed().named_parameters()], got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m, n=name, r=rank: f"[rank {r}] {n}: {m}")
