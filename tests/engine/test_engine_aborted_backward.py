"""A backward that raises, then a retry: the state is clean again and the step is the retry's alone (2 gloo ranks).

An exception inside backward (here: inside a non-reentrant activation checkpoint's recomputation,
or inside a custom autograd Function's backward after the recomputation ran, DeepSpeed's two
models of ``test_zero_activation_checkpoint_lifecycle.py``) never reaches the end of the pass.
The next root forward (or the step) unwinds it (zerorun/engine/mechanism/grad_sync.py,
``unwind_aborted``). Semantics under test:

* stage 3: at the retry's root forward pre-hook (one registered after ``initialize``) and after the
  retry's backward, every parameter is ``NOT_AVAILABLE`` with no active consumer, nothing is staged
  or armed, whether the retry is ``engine.backward``, a plain ``loss.backward()``, or a forward
  through ``engine.module`` itself (the root pre-hook unwinds then);
* at every stage, the step after the retry equals one process's SGD step on the retry's global batch
  alone: the aborted pass's gradients, those it had reduced already included, are discarded;
* mid-window (gradient accumulation, an earlier micro-step finished): where the aborted pass had summed
  a gradient already (stages 0-1; 2-3 where a bucket was reduced before the failure), it cannot be told
  from the window's, so the window is dropped with a ``RuntimeWarning`` and the step is the retry's
  alone (divided by the accumulation steps, as ``engine.backward`` divides every loss); where it had
  not (stage 3's small units wait for one shared reduce-scatter at the end of the pass), the earlier
  micro-step is kept, with no warning.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.dist_harness import run_distributed

H = 8
ROWS = 2
LR = 0.1


class RaiseOnce(torch.autograd.Function):
    """Raises in its backward while ``control["raise"]`` (then clears it)."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, control: dict) -> torch.Tensor:  # type: ignore[override]
        ctx.control = control
        return value

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        if ctx.control["raise"]:
            ctx.control["raise"] = False
            raise RuntimeError("injected backward failure")
        return grad, None


class Checkpointed(nn.Module):
    """A frozen layer and a trainable one under a non-reentrant checkpoint, then a head; the failure is
    raised in the recomputation ("recompute") or in a Function's backward after it ("function")."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.frozen = nn.Linear(H, H)
        self.frozen.requires_grad_(False)
        self.trainable = nn.Linear(H, H)
        self.head = nn.Linear(H, 1)
        self.where = where
        self.control = {"raise": False}

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        x = self.frozen(x)
        if self.where == "recompute" and self.control["raise"] and torch._C._current_graph_task_id() != -1:
            self.control["raise"] = False
            raise RuntimeError("injected backward failure")
        x = self.trainable(torch.tanh(x))
        return RaiseOnce.apply(x, self.control) if self.where == "function" else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self._inner, x, use_reentrant=False))


@dataclass(frozen=True)
class Case:
    stage: int
    where: str  # "recompute" | "function"
    aborted: str  # how the failing pass runs: "engine" (engine.backward) | "plain" (loss.backward())
    retry: str  # "engine" | "plain" | "module" (forward through engine.module, then engine.backward)
    gas: int = 1  # 2: a finished micro-step comes first, the failure lands mid-window
    # reduce_bucket_size 8: stage 3 reduces each unit on its own as soon as its gradients are in, stage 2 each
    # parameter (the head's before the failure); by default stage 3's small units share one reduce-scatter at
    # the end of the pass, and stage 2's one bucket waits for the trainable layer's gradients
    alone: bool = False

    @property
    def name(self) -> str:
        return f"stage{self.stage}-{self.where}-{self.aborted}-then-{self.retry}-gas{self.gas}-alone{self.alone}"

    @property
    def drops_window(self) -> bool:
        """The failing pass had summed a reduced gradient into a window an earlier micro-step began."""
        return self.gas == 2 and (self.alone or self.stage < 2)  # stages 0-1: autograd sums into the buffers


CASES = [Case(3, "recompute", "engine", "plain"), Case(3, "function", "engine", "engine"),
         Case(3, "function", "plain", "module"), Case(3, "function", "engine", "plain", alone=True),
         Case(3, "recompute", "engine", "engine", gas=2), Case(3, "recompute", "engine", "engine", gas=2, alone=True),
         Case(1, "function", "engine", "plain"), Case(1, "function", "engine", "engine", gas=2),
         Case(2, "function", "engine", "plain", gas=2, alone=True)]  # stage 0 runs stage 1's reducer


def _batch(seed: int, rank: int) -> torch.Tensor:
    return torch.randn(ROWS, H, generator=torch.Generator().manual_seed(1000 * seed + rank))


def _dirty(engine) -> list[str]:
    """What an aborted pass may leave (stage 3): gathered or consumed parameters, an armed reducer, staging."""
    out = [f"{n}: {p.ds_status.name}, consumers {set(p.ds_active_sub_modules)}"
           for n, p in engine.module.named_parameters()
           if p.ds_status.name != "NOT_AVAILABLE" or len(p.ds_active_sub_modules)]
    sync = engine.parts.grad_sync
    return out + [f"reducer: armed {sync.armed}, staged {sorted(sync.staging)}, group {sync.members}"
                  ] * bool(sync.armed or sync.staging or sync.members)


def _reference(model: nn.Module, case: Case, world: int) -> dict[str, torch.Tensor]:
    """One process, SGD on the retry's global batch, and the earlier micro-step's unless its window was dropped:
    each rank's loss averaged and divided by the accumulation steps (``engine.backward`` divides its loss, the
    engine's outputs a plain ``loss.backward()``)."""
    steps = [2] if case.gas == 1 or case.drops_window else [1, 2]
    loss = sum(model(_batch(s, r)).sum() / case.gas for s in steps for r in range(world))
    (loss / world).backward()
    with torch.no_grad():
        return {n: p - LR * p.grad if p.grad is not None else p.clone() for n, p in model.named_parameters()}


def _one(case: Case, rank: int, world: int) -> dict:
    import zerorun

    torch.manual_seed(0)
    model = Checkpointed(case.where)
    reference = _reference(copy.deepcopy(model), case, world)
    config = {"train_micro_batch_size_per_gpu": ROWS, "gradient_accumulation_steps": case.gas,
              "gradient_clipping": 0.0, "steps_per_print": 10**6, "optimizer": {"type": "SGD", "params": {"lr": LR}},
              "zero_optimization": {"stage": case.stage, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0,
                                    **({"reduce_bucket_size": 8} if case.alone else {})}}
    engine, *_ = zerorun.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                    config=config)
    stage3 = case.stage == 3
    if case.gas == 2:  # a finished micro-step first: its gradients are in the window's sums
        engine.backward(engine(_batch(1, rank)).sum())
        engine.step()
    model.control["raise"] = True
    loss = engine(_batch(0, rank).requires_grad_()).sum()
    try:
        engine.backward(loss) if case.aborted == "engine" else loss.backward()
    except RuntimeError as error:
        assert "injected backward failure" in str(error), error
    else:
        raise AssertionError("the injected failure did not raise")
    at_pre_hook: list[list[str]] = []
    handle = engine.module.register_forward_pre_hook(
        lambda _m, _a: at_pre_hook.append(_dirty(engine) if stage3 else []) or None)
    retry = _batch(2, rank).requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = (engine.module(retry) if case.retry == "module" else engine(retry)).sum()
    handle.remove()
    engine.backward(loss) if case.retry != "plain" else loss.backward()
    after = _dirty(engine) if stage3 else []
    engine.step()
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        got = {n: p.detach().clone() for n, p in model.named_parameters()}
    dropped = [str(w.message) for w in caught if "cannot be told apart" in str(w.message)]
    return {"pre_hook": at_pre_hook, "after": after, "finite": bool(torch.isfinite(retry.grad).all()),
            "diff": max(((got[n] - reference[n]).abs().max().item(), n) for n in reference), "dropped": dropped}


def _all(rank: int, world: int) -> dict[str, dict]:
    return {case.name: _one(case, rank, world) for case in CASES}


def test_aborted_backward_unwinds_for_a_clean_retry() -> None:
    results = run_distributed(_all, 2)
    for case in CASES:
        for rank, by_case in enumerate(results):
            r = by_case[case.name]
            where = f"{case.name} rank {rank}"
            assert r["pre_hook"] == [[]], f"{where}: at the retry's root forward pre-hook: {r['pre_hook']}"
            assert r["after"] == [], f"{where}: after the retry's backward: {r['after']}"
            assert r["finite"], where
            assert r["diff"][0] < 1e-5, f"{where}: the step differs from the reference by {r['diff']} ({r['dropped']})"
            assert bool(r["dropped"]) == case.drops_window, f"{where}: window-drop warnings {r['dropped']}"
