"""Two backward passes per micro-step (a GAN's discriminator: real, then fake) at every stage, against one process.

Semantics under test (see zerorun/engine/mechanism/grad_sync.py): the step uses, per parameter, the
sum over every backward pass since the last step of the rank-averaged gradients, the same
as one backward of the summed loss; each pass is divided by the accumulation steps
(``engine.backward`` divides its loss, the engine's outputs a plain ``loss.backward()``, as DeepSpeed's). The second pass of a boundary
micro-step lands on gradients that were already reduced (at stage 1 the reduce-scatter
left only the owned chunk defined).

SGD with momentum (Adam's scale invariance would hide a missing or doubled factor); fp32.
One spawned group per world size runs every case.
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import HID, MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows
from tests.engine.test_engine_plain_backward import PlainCase

STEPS = 3
LR = 0.05


class TwoCase(PlainCase):
    """The plain-backward cases' stage, config and name; ``mode`` here: "engine": engine.backward
    twice | "plain": loss.backward() twice | "partial": engine.backward twice, the second loss
    through the head alone (the other buckets get no new gradient) | "summed": one
    engine.backward of the two losses' sum (the common path: one reduction per bucket per step)."""


def _cases(world: int) -> list[TwoCase]:
    if world == 3:
        stage1 = [TwoCase(1, m, g) for m in ("engine", "plain") for g in (1, 2)] + [TwoCase(1, "partial")]
        return stage1 + [TwoCase(0, "plain", 2), TwoCase(2, "engine", 2), TwoCase(3, "engine", 2)]
    cases = [TwoCase(s, m, g) for s in (0, 1, 2, 3) for m in ("engine", "plain") for g in (1, 2)]
    return cases + [TwoCase(s, "partial", 2) for s in (1, 3)] + [TwoCase(1, "summed", 2)]


def _batches(step: int, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The two losses' batches of one step (the discriminator's real and fake ones)."""
    return [global_batch(step, rows), global_batch(100 + step, rows)]


def _loss(case: TwoCase, i: int, forward, head, batches, sl: slice) -> torch.Tensor:
    """Loss ``i`` of a micro-step on rows ``sl`` (in "partial" the second one runs the head alone)."""
    x, y = batches[i]
    if i == 1 and case.mode == "partial":
        return loss_fn(head(x[sl].repeat(1, 3)[:, :HID]), y[sl])
    return loss_fn(forward(x[sl]), y[sl])


def train(case: TwoCase, rank: int, world: int) -> dict:
    import zerorun

    model = make_model()
    engine, _, _, _ = zerorun.initialize(model=model, config=case.config())
    rows = MICRO_BATCH * world * case.gas
    losses = []
    for step in range(STEPS):
        batches = _batches(step, rows)
        for k in range(case.gas):
            sl = rank_rows(k, rank, world)
            if case.mode == "summed":
                parts = [_loss(case, i, engine, model.head, batches, sl) for i in range(2)]
                engine.backward(parts[0] + parts[1])
                losses += [p.item() for p in parts]
                engine.step()
                continue
            for i in range(2):  # each loss is built just before its backward, as a GAN's are
                loss = _loss(case, i, engine, model.head, batches, sl)
                loss.backward() if case.mode == "plain" else engine.backward(loss)
                losses.append(loss.item())
            engine.step()
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        params = [p.detach().clone() for p in model.parameters()]
    return {"params": params, "losses": losses, "global_steps": engine.global_steps,
            "buckets": len(engine.parts.buckets), "reduce_scatters": engine.coll.counter.counts["reduce_scatter"].calls}


def reference(case: TwoCase, world: int) -> tuple[list[torch.Tensor], list[float]]:
    """One process: one backward per micro-step of the summed loss over the global micro-batch."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = MICRO_BATCH * world * case.gas
    factor = 1.0 / case.gas  # engine.backward divides by gas, the outputs a plain backward
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        batches = _batches(step, rows)
        for k in range(case.gas):
            sl = slice(k * world * MICRO_BATCH, (k + 1) * world * MICRO_BATCH)
            parts = [_loss(case, i, model, model.head, batches, sl) for i in range(2)]
            (sum(parts) * factor).backward()
            losses += [p.item() for p in parts]
        opt.step()
    return [p.detach().clone() for p in model.parameters()], losses


def _train_all(rank: int, world: int) -> dict:
    return {c.name: train(c, rank, world) for c in _cases(world)}


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def runs(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    return request.param, run_distributed(_train_all, request.param, timeout=240)


def test_two_backwards_per_step_match_one_backward_of_the_summed_loss(runs: tuple[int, list[dict]]) -> None:
    world, results = runs
    failures = []
    for case in _cases(world):
        want, want_losses = reference(case, world)
        mean_losses = torch.tensor([r[case.name]["losses"] for r in results], dtype=torch.float64).mean(0)
        rel = ((mean_losses - torch.tensor(want_losses, dtype=torch.float64)).abs() / mean_losses.abs()).max()
        if rel > 1e-5:
            failures.append(f"{case.name}: loss relative error {rel.item():.3g}")
        for rank, r in enumerate(results):
            got = r[case.name]
            assert got["global_steps"] == STEPS, case.name
            if case.stage == 1:  # one reduce-scatter per bucket per backward on the boundary micro-step
                passes = 1 if case.mode == "summed" else 2
                assert got["reduce_scatters"] == passes * got["buckets"] * STEPS, (case.name, got["reduce_scatters"])
            worst = max(torch.dist(g, w).item() for g, w in zip(got["params"], want, strict=True))
            if worst > 1e-4:
                failures.append(f"[rank {rank}] {case.name}: parameter distance {worst:.3g}")
    assert not failures, "\n".join(failures)
