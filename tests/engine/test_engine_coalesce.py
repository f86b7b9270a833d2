"""``engine.coalesce_grad_reduction()`` (DeepSpeed 0.19.8's context) at stages 1-3, world 2, against the same
training without the block (bit-exact) and against one process.

Semantics under test (see zerorun/engine/mechanism/grad_sync.py): one with-block is one optimizer step; the
``engine.backward`` passes inside keep their gradients local (stage 1: no reduction until the exit; stages
2-3 reduce-scatter into the shard as accumulation does) and the exit reduces what they summed once, so the
parameters after the steps are those of the same passes without the block, where the script marks the
last pass as the boundary (DeepSpeed's own test loop). Also: stage 0 raises ``NotImplementedError``,
``step()`` inside and nesting with ``no_sync()`` either way raise ``AssertionError``, and the boundary the
script set is restored at the exit. SGD with momentum, fp32; one spawned group runs every case.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows

STEPS = 2
PASSES = 3
LR = 0.05
CASES = ("1", "2", "3", "3-mics")  # the stage; MiCS: the replica sum the exit completes


def _config(stage: int, mics: bool = False) -> dict:
    zero: dict = {"stage": stage, "reduce_bucket_size": 60, "overlap_comm": True}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # every unit partitioned
    if mics:  # shard groups of one rank: the replica sum at the boundary does all the averaging
        zero["mics_shard_size"] = 1
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0, "steps_per_print": 10**6,
            "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}}, "zero_optimization": zero}


def _train(case: str, coalesce: bool, rank: int, world: int) -> list[torch.Tensor]:
    import zerorun

    model = make_model()
    engine, _, _, _ = zerorun.initialize(model=model, config=_config(int(case[0]), mics="mics" in case))
    for step in range(STEPS):
        x, y = global_batch(step, MICRO_BATCH * world * PASSES)
        with engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext():
            for i in range(PASSES):
                sl = rank_rows(i, rank, world)
                loss = loss_fn(engine(x[sl]), y[sl])
                engine.set_gradient_accumulation_boundary(i == PASSES - 1)
                engine.backward(loss)
        engine.step()
    assert engine.global_steps == STEPS
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        return [p.detach().clone() for p in model.parameters()]


def _misuse(rank: int, world: int) -> dict[str, str]:
    """Each refusal's exception class name and message, keyed by the misuse."""
    import zerorun

    seen: dict[str, str] = {}

    def catch(name: str, fn) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the class is what is checked
            seen[name] = f"{type(exc).__name__}|{isinstance(exc, AssertionError)}|" \
                         f"{isinstance(exc, NotImplementedError)}|{exc}"

    engines = {s: zerorun.initialize(model=make_model(), config=_config(s))[0] for s in (0, 1)}

    def stage0() -> None:
        with engines[0].coalesce_grad_reduction():
            pass

    def step_inside() -> None:
        with engines[1].coalesce_grad_reduction():
            engines[1].step()

    def no_sync_inside() -> None:
        with engines[1].coalesce_grad_reduction(), engines[1].no_sync():
            pass

    def coalesce_inside() -> None:
        with engines[1].no_sync(), engines[1].coalesce_grad_reduction():
            pass

    for name, fn in [("stage0", stage0), ("step", step_inside), ("no_sync_inside", no_sync_inside),
                     ("coalesce_inside", coalesce_inside)]:
        catch(name, fn)
    engine = engines[1]
    engine.set_gradient_accumulation_boundary(False)
    with engine.coalesce_grad_reduction():
        engine.set_gradient_accumulation_boundary(True)
        engine.backward(loss_fn(engine(torch.ones(MICRO_BATCH, 7)), torch.zeros(MICRO_BATCH, 9)))
    seen["restored"] = repr(engine._is_gradient_accumulation_boundary)
    seen["pipeline"] = repr(engine.pipeline_parallelism)
    return seen


def _all(rank: int, world: int) -> dict:
    out: dict = {f"{s}-{c}": _train(s, c, rank, world) for s in CASES for c in (False, True)}
    out["misuse"] = _misuse(rank, world)
    return out


def _reference(world: int) -> list[torch.Tensor]:
    """One process: per step, the sum of the passes' losses, each the mean over the world's rows of that pass."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = global_batch(step, MICRO_BATCH * world * PASSES)
        for i in range(PASSES):
            sl = slice(i * world * MICRO_BATCH, (i + 1) * world * MICRO_BATCH)
            loss_fn(model(x[sl]), y[sl]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_distributed(_all, 2, timeout=240)


@pytest.mark.parametrize("case", CASES)
def test_coalesced_steps_equal_the_same_passes_without_the_block(results: list[dict], case: str) -> None:
    want = _reference(2)
    for rank, r in enumerate(results):
        plain, coalesced = r[f"{case}-False"], r[f"{case}-True"]
        for i, (a, b, w) in enumerate(zip(plain, coalesced, want, strict=True)):
            assert torch.equal(a, b), f"rank {rank} param {i}: block differs from no block (bit-exact expected)"
            torch.testing.assert_close(b, w, rtol=1e-5, atol=1e-6, msg=f"rank {rank} param {i} vs one process")


def test_misuse_is_refused_as_deepspeed_refuses_it(results: list[dict]) -> None:
    seen = results[0]["misuse"]
    assert seen["stage0"].startswith("CoalesceUnsupported|False|True|"), seen["stage0"]
    assert "requires ZeRO stage 1/2/3, got stage 0" in seen["stage0"]
    for name in ("step", "no_sync_inside"):
        assert seen[name].startswith("NoSyncMisuse|True|"), seen[name]
        assert "no_sync" in seen[name]
    assert seen["coalesce_inside"].startswith("NoSyncMisuse|True|") and "nested" in seen["coalesce_inside"]
    assert seen["restored"] == "False"  # what the script had set before the block, not the True set inside
    assert seen["pipeline"] == "False"
