"""The two orders of stages 1-2's optimizer step give the same training, to the bit.

On the CPU the engine steps every bucket in one optimizer call and then all-gathers; on
CUDA (``overlap_gather``) it all-gathers each bucket while the next one steps. No GPU
exists here, so the CUDA order is forced on gloo: the arithmetic is the same, only the
order of the optimizer calls and the collectives differs, and every rank must end with
the parameters of the default order, which the parity tests compare with one process.
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import Case, global_batch, loss_fn, make_model, rank_rows

CASES = [Case(stage, dtype, gas=2, clip=0.05, optimizer="AdamW") for stage in (1, 2) for dtype in ("fp32", "bf16")]


def _train(case: Case, rank: int, world: int, overlap_gather: bool) -> list[torch.Tensor]:
    import zerorun

    model = make_model()
    engine, _, _, _ = zerorun.initialize(model=model, config=case.config())
    assert engine.parts.masters.overlap_gather is False  # the CPU default
    engine.parts.masters.overlap_gather = overlap_gather
    for step in range(3):
        x, y = global_batch(step, 4 * world * case.gas)
        for k in range(case.gas):
            sl = rank_rows(k, rank, world)
            engine.backward(loss_fn(engine(x[sl].to(engine.precision.compute_dtype)), y[sl]))
            engine.step()
    return [p.detach().float().clone() for p in model.parameters()]


def _both_orders(rank: int, world: int) -> dict[str, list[list[torch.Tensor]]]:
    return {c.name: [_train(c, rank, world, overlap) for overlap in (False, True)] for c in CASES}


@pytest.fixture(scope="module")
def per_rank() -> list[dict]:
    return run_distributed(_both_orders, 2, timeout=180)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_overlapped_step_equals_the_whole_step(per_rank: list[dict], case: Case) -> None:
    for rank, r in enumerate(per_rank):
        whole, overlapped = r[case.name]
        for a, b in zip(whole, overlapped, strict=True):
            assert torch.equal(a, b), f"[rank {rank}] {case.name}: the overlapped step differs"
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0][case.name][0], per_rank[1][case.name][0], strict=True))
