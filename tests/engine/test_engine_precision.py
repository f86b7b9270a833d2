"""fp16 dynamic loss scaling across ranks, and non-finite steps in fp32/bf16 (one spawned group).

An inf is injected into one parameter's gradient on rank 1 only. Every rank must skip
that step (parameters unchanged everywhere) and the scale must follow DeepSpeed's rule:
with hysteresis 2 the first overflow only spends the hysteresis, the second halves the
scale. In fp32 a nan gradient on rank 0 must skip the step on every rank with a warning.
"""

from __future__ import annotations

import warnings

import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows

POISON_STEPS = {1, 2}


def _train(rank: int, world: int, stage: int, dtype: str, poison_rank: int, poison: float) -> dict:
    import zerorun
    from zerorun.engine.engine import NonFiniteGradientWarning

    cfg = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "steps_per_print": 10**6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 60}}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": 2,
                       "loss_scale_window": 1000, "min_loss_scale": 1}
    model = make_model()
    engine, _, _, _ = zerorun.initialize(model=model, config=cfg)
    state = {"step": 0}

    def inject(grad: torch.Tensor) -> torch.Tensor:
        if rank == poison_rank and state["step"] in POISON_STEPS:
            grad = grad.clone()
            grad.view(-1)[0] = poison
        return grad

    model.fc1.weight.register_hook(inject)
    scales, changed, warned = [], [], []
    for step in range(4):
        state["step"] = step
        x, y = global_batch(step, MICRO_BATCH * world)
        before = [p.detach().clone() for p in model.parameters()]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.backward(loss_fn(engine(x[rank_rows(0, rank, world)].to(engine.precision.compute_dtype)), y[rank_rows(0, rank, world)]))
            engine.step()
        warned.append(any(issubclass(w.category, NonFiniteGradientWarning) for w in caught))
        changed.append(any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)))
        scales.append(engine.loss_scale)
    return {"scales": scales, "changed": changed, "warned": warned, "skipped": engine.skipped_steps}


def _all(rank: int, world: int) -> dict:
    out = {}
    for stage in (0, 1, 2):
        out[("fp16", stage)] = _train(rank, world, stage, "fp16", poison_rank=1, poison=float("inf"))
        out[("fp32", stage)] = _train(rank, world, stage, "fp32", poison_rank=0, poison=float("nan"))
    return out


def test_overflow_skips_on_every_rank_and_scale_follows_hysteresis() -> None:
    results = run_distributed(_all, 2, timeout=180)
    for stage in (0, 1, 2):
        for rank, r in enumerate(results):
            fp16 = r[("fp16", stage)]
            assert fp16["changed"] == [True, False, False, True], (stage, rank, fp16)
            assert fp16["scales"] == [256.0, 256.0, 128.0, 128.0], (stage, rank, fp16)
            assert fp16["skipped"] == 2
            assert not any(fp16["warned"])  # overflow is routine under dynamic scaling: no warning
            fp32 = r[("fp32", stage)]
            assert fp32["changed"] == [True, False, False, True], (stage, rank, fp32)
            assert fp32["warned"] == [False, True, True, False], (stage, rank, fp32)
            assert fp32["scales"] == [1.0] * 4
