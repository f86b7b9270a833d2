"""One plain ``loss.backward()`` over several engines' modules (DeepSpeed's multiple-models pattern: a shared
loss, then ``engine._backward_epilogue()`` on each), against one process, at world 2.

Three engines at stages 1, 2 and 3 train copies of the tiny model from different seeds; the loss is
``sum(loss_i / (i + 1))`` over the modules called directly (``engine.module(x)``: no engine forward, so no
accumulation hooks; one micro-step per step). Each engine's reducer ends its own pass when autograd finishes;
the epilogue has nothing left to do. SGD with momentum, fp32, the parity tests' tolerance.
"""

from __future__ import annotations

import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows

STAGES = (1, 2, 3)
STEPS = 3
LR = 0.05


def _config(stage: int) -> dict:
    zero: dict = {"stage": stage, "reduce_bucket_size": 60}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_clipping": 0.0, "steps_per_print": 10**6,
            "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}}, "zero_optimization": zero}


def _train(rank: int, world: int) -> list[list[torch.Tensor]]:
    import zerorun

    engines = [zerorun.initialize(model=make_model(seed=10 + i), config=_config(s))[0] for i, s in enumerate(STAGES)]
    for step in range(STEPS):
        x, y = global_batch(step, MICRO_BATCH * world)
        sl = rank_rows(0, rank, world)
        loss = sum(loss_fn(e.module(x[sl]), y[sl]) / (i + 1) for i, e in enumerate(engines))
        loss.backward()
        for e in engines:
            e._backward_epilogue()
        for e in engines:
            e.step()
    out = []
    for e in engines:
        with zerorun.zero.GatheredParameters(list(e.module.parameters())):
            out.append([p.detach().clone() for p in e.module.parameters()])
        e.destroy()
    return out


def _reference(world: int) -> list[list[torch.Tensor]]:
    models = [make_model(seed=10 + i) for i in range(len(STAGES))]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9) for m in models]
    for step in range(STEPS):
        x, y = global_batch(step, MICRO_BATCH * world)
        sum(loss_fn(m(x), y) / (i + 1) for i, m in enumerate(models)).backward()
        for o in opts:
            o.step()
            o.zero_grad()
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def test_a_shared_loss_over_three_engines_matches_one_process() -> None:
    world = 2
    want = _reference(world)
    for rank, got in enumerate(run_distributed(_train, world, timeout=240)):
        for stage, g_params, w_params in zip(STAGES, got, want, strict=True):
            for g, w in zip(g_params, w_params, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m, s=stage, r=rank: f"[rank {r}] "
                                           f"stage {s}: {m}")
