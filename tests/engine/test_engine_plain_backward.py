"""A plain ``loss.backward()`` and ``model/optimizer.zero_grad()`` at every stage, against one process.

Semantics under test (see zerorun/engine/mechanism/grad_sync.py):
* plain ``loss.backward()`` (no ``engine.backward``) reduces the gradients at every stage:
  averaged over ranks and divided by the accumulation steps (as DeepSpeed 0.19.8: the engine's
  outputs divide it), so with accumulation g the step uses the mean of the g micro-steps'
  rank-averaged gradients, as after ``engine.backward``;
  at stage 0 ``param.grad`` is already reduced when ``backward()`` returns (as DDP);
* ``model.zero_grad()``, ``optimizer.zero_grad()`` (the optimizer ``initialize`` returns)
  and ``engine.zero_grad()`` drop every gradient accumulated since the last step, whether
  it came from a plain backward or from ``engine.backward``;
* fp16 loss scaling with a plain backward through ``engine(...)`` is refused as the backward starts under
  the dynamic scale (DeepSpeed's ``RuntimeError``); past the engine, or under a static scale, the step
  takes the unscaled gradients as they are (with a warning), and refuses a window mixing both kinds;
  ``engine.scale(loss).backward()`` (DeepSpeed's manual backward) is ``engine.backward(loss)``.

SGD with momentum (not Adam, whose scale invariance would hide a missing or doubled
factor); fp32, so the tolerance is the parity tests' rtol 1e-5. One spawned group per
world size runs every case.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows

STEPS = 3
LR = 0.05
MODES = ("plain", "zero-model", "zero-optimizer", "zero-then-step", "engine-zero-model")


@dataclass(frozen=True)
class PlainCase:
    stage: int
    mode: str
    gas: int = 1

    @property
    def name(self) -> str:
        return f"stage{self.stage}-{self.mode}-gas{self.gas}"

    def config(self) -> dict:
        zero: dict = {"stage": self.stage, "reduce_bucket_size": 60, "overlap_comm": self.stage % 2 == 0}
        if self.stage == 3:
            zero["stage3_param_persistence_threshold"] = 0  # every unit partitioned
        return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": self.gas,
                "gradient_clipping": 0.0, "steps_per_print": 10**6,
                "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}}, "zero_optimization": zero}


def _cases(world: int) -> list[PlainCase]:
    if world == 3:
        return [PlainCase(2, "plain", 2), PlainCase(3, "plain", 2), PlainCase(1, "zero-model")]
    cases = [PlainCase(s, m) for s in (0, 1, 2, 3) for m in MODES]
    return cases + [PlainCase(s, "plain", 2) for s in (0, 1, 2, 3)]


def _clears(case: PlainCase, step: int) -> bool:
    """Whether this step first backpropagates a batch that is then cleared."""
    return case.mode != "plain" and (case.mode != "zero-then-step" or step % 2 == 1)


def _clear(case: PlainCase, engine, model, optimizer) -> None:
    if case.mode == "zero-optimizer":
        optimizer.zero_grad()
    else:
        model.zero_grad()


def train(case: PlainCase, rank: int, world: int) -> dict:
    import zerorun

    model = make_model()
    engine, optimizer, _, _ = zerorun.initialize(model=model, config=case.config())
    rows = MICRO_BATCH * world * case.gas
    stage0_grads = None
    for step in range(STEPS):
        x, y = global_batch(step, rows)
        if _clears(case, step):  # gradients of another batch land first, then are cleared
            xa, ya = global_batch(100 + step, rows)
            sl = rank_rows(0, rank, world)
            loss = loss_fn(engine(xa[sl].to(engine.precision.compute_dtype)), ya[sl])
            engine.backward(loss) if case.mode == "engine-zero-model" else loss.backward()
            _clear(case, engine, model, optimizer)
            if case.mode == "zero-then-step":
                engine.step()  # nothing left to step with: a zero gradient
                continue
        for k in range(case.gas):
            sl = rank_rows(k, rank, world)
            loss = loss_fn(engine(x[sl].to(engine.precision.compute_dtype)), y[sl])
            engine.backward(loss) if case.mode == "engine-zero-model" else loss.backward()
            if case.stage == 0 and step == 0 and case.gas == 1:
                stage0_grads = [p.grad.detach().clone() for p in model.parameters()]
            engine.step()
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        params = [p.detach().clone() for p in model.parameters()]
    return {"params": params, "global_steps": engine.global_steps, "stage0_grads": stage0_grads}


def reference(case: PlainCase, world: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One process: each step's gradient is the mean over micro-steps of the global micro-batch's mean loss."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = MICRO_BATCH * world * case.gas
    first_grads: list[torch.Tensor] = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        if case.mode == "zero-then-step" and step % 2 == 1:
            opt.step()  # zero gradients: only momentum moves the weights
            continue
        x, y = global_batch(step, rows)
        for k in range(case.gas):
            sl = slice(k * world * MICRO_BATCH, (k + 1) * world * MICRO_BATCH)
            (loss_fn(model(x[sl]), y[sl]) / case.gas).backward()
        if step == 0:
            first_grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                           for p in model.parameters()]
        opt.step()
    return [p.detach().clone() for p in model.parameters()], first_grads


def _train_all(rank: int, world: int) -> dict:
    out = {c.name: train(c, rank, world) for c in _cases(world)}
    out["fp16-error"] = _fp16_plain_backward_error(rank, world)
    out["fp16-scaled"] = _fp16_scaled_backward_gap(rank, world)
    return out


def _fp16_scaled_backward_gap(rank: int, world: int) -> float:
    """DeepSpeed's manual backward, ``engine.scale(loss).backward()`` at gas 2 under fp16 loss scaling: the
    weights after one step, against ``engine.backward(loss)``'s (the largest difference)."""
    import zerorun

    cfg = PlainCase(2, "plain", 2).config() | {"fp16": {"enabled": True, "initial_scale_power": 4}}
    weights = []
    for manual in (False, True):
        engine, _, _, _ = zerorun.initialize(model=make_model(), config=cfg)
        for k in range(2):
            x, y = global_batch(k, MICRO_BATCH * world)
            loss = loss_fn(engine(x[rank_rows(0, rank, world)].to(engine.precision.compute_dtype)),
                           y[rank_rows(0, rank, world)])
            engine.scale(loss).backward() if manual else engine.backward(loss)
            engine.step()
        weights.append([p.detach().float().clone() for p in engine.module.parameters()])
        engine.destroy()
    return max((a - b).abs().max().item() for a, b in zip(*weights, strict=True))


def _fp16_plain_backward_error(rank: int, world: int) -> dict[str, str]:
    """A plain backward under fp16. Through ``engine(...)`` under the dynamic scale: refused as it starts
    (DeepSpeed's RuntimeError). Past the engine (``engine.module(...)``), or under a static scale: the step
    takes the unscaled gradients as they are, with a warning, and its weights are those of the same passes
    run through ``engine.backward``. Scaled and unscaled passes summed in one step: refused at the step."""
    import warnings

    import zerorun
    from zerorun.engine.errors import EngineError

    x, y = global_batch(0, MICRO_BATCH * world)
    sl = rank_rows(0, rank, world)

    def run(fp16: dict, passes: list[str]) -> tuple[str, list[torch.Tensor]]:
        cfg = PlainCase(0, "plain", len(passes)).config() | {"fp16": {"enabled": True, **fp16}}
        engine, _, _, _ = zerorun.initialize(model=make_model(), config=cfg)
        xs = x[sl].to(engine.precision.compute_dtype)
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                for how in passes:
                    if how == "engine":
                        engine.backward(loss_fn(engine(xs), y[sl]))
                    else:  # "plain": through engine(...); "module": past it
                        out = engine(xs) if how == "plain" else engine.module(xs)
                        (loss_fn(out, y[sl]) / (len(passes) if how == "module" else 1)).backward()
                    engine.step()
            said = [str(w.message) for w in seen if type(w.message).__name__ == "UnscaledBackwardWarning"]
            result = f"warned: {said[0]}" if said else "no error"
        except (RuntimeError, EngineError) as e:
            result = f"{type(e).__name__}: {e}"
        weights = [p.detach().float().clone() for p in engine.module.parameters()]
        engine.destroy()
        return result, weights

    out = {"dynamic": run({"initial_scale_power": 4}, ["plain"])[0]}
    for kind, fp16, passes in (("static", {"loss_scale": 16}, ["plain"]), ("module", {"initial_scale_power": 4}, ["module"])):
        result, weights = run(fp16, passes)
        _, want = run(fp16, ["engine"])
        gap = max((a - b).abs().max().item() for a, b in zip(weights, want, strict=True))
        out[kind] = result + f" | gap {gap:.1e}"
    out["mixed"] = run({"initial_scale_power": 4}, ["engine", "module"])[0]
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def runs(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    return request.param, run_distributed(_train_all, request.param, timeout=240)


def test_plain_backward_and_zero_grad_match_reference(runs: tuple[int, list[dict]]) -> None:
    world, results = runs
    for case in _cases(world):
        want, first_grads = reference(case, world)
        for rank, r in enumerate(results):
            got = r[case.name]
            assert got["global_steps"] == STEPS, case.name
            for g, w in zip(got["params"], want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, rank=rank, case=case: f"[rank {rank}] {case.name}: {m}")
            if got["stage0_grads"] is not None:  # reduced by the time backward() returns, as DDP's
                for g, w in zip(got["stage0_grads"], first_grads, strict=True):
                    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_plain_backward_under_fp16_loss_scaling(runs: tuple[int, list[dict]]) -> None:
    _, results = runs
    for rank, r in enumerate(results):
        got = r["fp16-error"]
        assert got["dynamic"].startswith(f"LossScalingRequired: [rank {rank}] Loss scaling is required for this "
                                         "configuration"), got
        assert "engine.scale(loss).backward()" in got["dynamic"], got
        for kind in ("static", "module"):  # stepped unscaled, said once, the weights of engine.backward's step
            said, gap = got[kind].split(" | gap ")
            assert said.startswith(f"warned: [rank {rank}] the backward passes of step 0 ran without fp16's loss "
                                   "scale"), got[kind]
            assert float(gap) < 1e-3, got[kind]  # fp16 weights: the two differ by the gradients' rounding
        assert got["mixed"].startswith(f"EngineError: [rank {rank}] this step sums backward passes"), got


def test_engine_scale_then_plain_backward_is_engine_backward(runs: tuple[int, list[dict]]) -> None:
    """``engine.scale(loss).backward()`` (DeepSpeed's manual backward) applies the loss scale, the engine's
    outputs the 1/gas, as ``engine.backward`` applies both, and the step takes it as scaled."""
    _, results = runs
    assert [r["fp16-scaled"] for r in results] == [0.0] * len(results)


def test_routed_zero_grad_survives_deepcopy_and_pickle() -> None:
    """The routed ``zero_grad`` calls the engine; copies of the module (EMA, torch.save) get the plain one."""
    import copy
    from types import SimpleNamespace

    from zerorun.engine.mechanism.grad_sync import route_zero_grad

    calls: list[int] = []
    model = make_model()
    route_zero_grad([model], SimpleNamespace(zero=lambda: calls.append(1)))  # type: ignore[list-item]
    model(torch.randn(2, 7)).sum().backward()
    model.zero_grad()
    assert calls == [1] and all(p.grad is None for p in model.parameters())
    for clone in (copy.deepcopy(model), torch.load(_saved(model), weights_only=False)):
        clone(torch.randn(2, 7)).sum().backward()
        clone.zero_grad()
        assert calls == [1] and all(p.grad is None for p in clone.parameters())


def _saved(model: torch.nn.Module):
    import io

    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return buf
