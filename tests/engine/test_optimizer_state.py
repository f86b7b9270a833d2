"""Adam's state is made at initialize (the first step allocates none of it) and trains exactly as torch's
lazily made state does; optimizers whose layout is not torch's Adam's keep their lazy state."""

from __future__ import annotations

import pytest
import torch

from zerorun.compat.optimizers import DeepSpeedCPUAdam, FusedAdam
from zerorun.engine.training.optimizer_state import make_adam_state


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def _three_steps(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


BUILDS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
    "adamw-amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "ds-cpu-adam": lambda ps: DeepSpeedCPUAdam(ps, lr=1e-2, weight_decay=0.1),
    "ds-fused-adam-no-bias-correction": lambda ps: FusedAdam(ps, lr=1e-2, bias_correction=False),
}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_state_made_up_front_trains_as_torchs_lazy_state(name: str) -> None:
    lazy_params, early_params = _params(), _params()
    lazy, early = BUILDS[name](lazy_params), BUILDS[name](early_params)
    assert make_adam_state(early) == 2 and not lazy.state
    made = {k: (v.dtype, v.device, v.shape) for k, v in early.state[early_params[0]].items()}
    _three_steps(lazy, lazy_params)
    _three_steps(early, early_params)
    assert made == {k: (v.dtype, v.device, v.shape) for k, v in lazy.state[lazy_params[0]].items()}
    for a, b in zip(lazy_params, early_params, strict=True):
        assert torch.equal(a, b)
        for key, value in lazy.state[a].items():
            assert torch.equal(value, early.state[b][key]), key


def test_existing_state_is_kept_and_unknown_layouts_stay_lazy() -> None:
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-2)
    _three_steps(opt, params)
    before = {k: v.clone() for k, v in opt.state[params[0]].items()}
    assert make_adam_state(opt) == 0
    assert all(torch.equal(v, opt.state[params[0]][k]) for k, v in before.items())

    class MyAdam(torch.optim.Adam):  # a subclass may make more keys in its first step: not touched
        pass

    for other in (MyAdam(_params(), lr=1e-2), torch.optim.SGD(_params(), lr=1e-2, momentum=0.9)):
        assert make_adam_state(other) == 0 and not other.state


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_engine_makes_the_state_before_the_first_step(world_of_one: None, stage: int) -> None:
    import zerorun

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": stage}}
    engine, opt, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    stepped = [p for g in inner.param_groups for p in g["params"]]
    storages = {id(p): {k: v.data_ptr() for k, v in inner.state[p].items() if k != "step"} for p in stepped}
    assert stepped and all(set(s) == {"exp_avg", "exp_avg_sq"} for s in storages.values())
    engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
    engine.step()
    after = {id(p): {k: v.data_ptr() for k, v in inner.state[p].items() if k != "step"} for p in stepped}
    assert after == storages  # the step wrote into the state made at initialize: it allocated none
    assert all(float(inner.state[p]["step"]) == 1 for p in stepped)
