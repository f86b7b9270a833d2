"""DeepSpeed 0.19.8 semantics where zerorun used to differ silently (single process, world of one).

* ``gradient_clipping`` absent from the config means 1.0.
* ``load_checkpoint`` leaves the global RNG alone unless ``load_rng_state=True``.
* A client optimizer plus a config ``optimizer`` block: the client's is used, with a warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import zerorun
from zerorun.config import ConfigWarning, load_config

BASE = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 1.0}}}


def test_gradient_clipping_defaults_to_one_when_absent() -> None:
    assert load_config(BASE).gradient_clipping == 1.0
    assert load_config({**BASE, "gradient_clipping": 0.0}).gradient_clipping == 0.0


def test_absent_gradient_clipping_clips_the_step_to_norm_one() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1, bias=False)
    start = model.weight.detach().clone()
    engine, *_ = zerorun.initialize(model=model, config=BASE)
    x = torch.full((2, 3), 10.0)  # gradient norm far above 1
    engine.backward(engine(x).sum())
    engine.step()
    step = float((start - model.weight.detach()).norm())  # SGD lr 1: the step is the clipped gradient
    assert step == pytest.approx(1.0, rel=1e-4)


def _trained_engine(tmp_path: Path) -> object:
    torch.manual_seed(0)
    engine, *_ = zerorun.initialize(model=nn.Linear(3, 1), config=BASE)
    engine.backward(engine(torch.ones(2, 3)).sum())
    engine.step()
    engine.save_checkpoint(str(tmp_path), tag="t")
    return engine


def test_load_checkpoint_keeps_the_rng_unless_asked(tmp_path: Path) -> None:
    engine = _trained_engine(tmp_path)
    saved_draw = torch.rand(3)  # what the generator gives right after the save
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    engine.load_checkpoint(str(tmp_path), tag="t")
    assert torch.equal(torch.rand(3), expected)  # the script's own seeding stands
    engine.load_checkpoint(str(tmp_path), tag="t", load_rng_state=True)
    assert torch.equal(torch.rand(3), saved_draw)


def test_client_optimizer_wins_over_the_config_block_with_a_warning() -> None:
    model = nn.Linear(3, 1)
    client = torch.optim.Adam(model.parameters(), lr=0.01)
    cfg = {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": 0.5}}}
    with pytest.warns(ConfigWarning, match=r"optimizer block \(AdamW\) is ignored.*\(Adam\), which is used"):
        engine, opt, _, _ = zerorun.initialize(model=model, optimizer=client, config=cfg)
    assert opt is client and engine.get_lr() == [0.01]
