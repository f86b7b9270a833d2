"""zerorun's schedules give DeepSpeed 0.19.8's values exactly, at every step, in every case recorded.

tests/fixtures/ds_schedules.json was made by tests/fixtures/make_ds_schedules.py with DeepSpeed's
own classes; each case here is replayed with zerorun's (``deepspeed.runtime.lr_schedules`` under
the drop-in, and the config path's ``build_scheduler``): the optimizer's lrs and betas, and what
``get_lr``/``get_last_lr``/``get_mom``/``get_lr_ratio``/``state_dict`` answer, compared with ``==``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from zerorun.compat import lr_schedules
from zerorun.engine.training.schedulers import build_scheduler

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from schedule_cases import CASES, trace  # noqa: E402

RECORDED = json.loads((FIXTURES / "ds_schedules.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_schedule_equals_deepspeed_at_every_step(case: tuple) -> None:
    expected = RECORDED["cases"][case[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unknown-warmup-type and no-betas cases warn, as DeepSpeed's do
        got = trace(lr_schedules, case)
    assert sorted(got) == sorted(expected), "the scheduler's methods differ from DeepSpeed's"
    for key, theirs in expected.items():
        first = next((i for i, (a, b) in enumerate(zip(got[key], theirs, strict=True)) if a != b), None)
        assert first is None, f"{key} after {first} step(s): {got[key][first]} != DeepSpeed's {theirs[first]}"


@pytest.mark.parametrize("case", [c for c in CASES if "last_batch_iteration" not in c[2]][:: 4], ids=lambda c: c[0])
def test_config_block_builds_the_same_schedule(case: tuple) -> None:
    """The engine's path (the config's ``scheduler`` block) gives the same values as the class."""
    config_path = SimpleNamespace(**{case[1]: lambda opt, **p: build_scheduler(case[1], p, opt)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = trace(config_path, case)
    assert got["lr"] == RECORDED["cases"][case[0]]["lr"]


@pytest.mark.parametrize("name", ["onecycle-decay", "cosine-linear", "range-staircase"])
def test_engine_steps_the_config_schedule_as_deepspeed_does(name: str) -> None:
    """Through ``initialize`` and ``engine.step()``: the lr (and OneCycle's betas) each optimizer step runs with
    are DeepSpeed's recorded values, step by step."""
    import torch

    import zerorun

    _, schedule, params, kind, _ = next(c for c in CASES if c[0] == name)
    assert kind == "adamw"
    model = torch.nn.Linear(3, 1)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.05}},
           "scheduler": {"type": schedule, "params": params}}
    engine, opt, _, _ = zerorun.initialize(model=model, config=cfg)
    expected = RECORDED["cases"][name]
    for step in range(12):
        group = opt.param_groups[0]
        assert [group["lr"]] == expected["lr"][step], f"lr of optimizer step {step}"
        assert [list(group["betas"])] == expected["betas"][step], f"betas of optimizer step {step}"
        engine.backward(engine(torch.ones(2, 3)).sum())
        engine.step()
