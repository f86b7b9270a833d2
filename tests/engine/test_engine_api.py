"""``zerorun.initialize`` in this process, world size 1 (no launcher environment).

Covers what the spawned tests do not: the returned loader and scheduler, optimizer
parameter groups, a callable client optimizer, and the errors (with their hints).
The default process group the engine creates is destroyed after each test.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import zerorun
from zerorun.engine.errors import EngineError
from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS

BASE = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6}


pytestmark = pytest.mark.usefixtures("world_of_one")  # tests/conftest.py


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))


def test_loader_scheduler_and_training_in_one_process() -> None:
    data = TensorDataset(torch.randn(40, 5), torch.randn(40, 2))
    cfg = {**BASE, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.1, "warmup_num_steps": 4,
                                                        "warmup_type": "linear"}}}
    model = _model()
    engine, opt, loader, sched = zerorun.initialize(model=model, config=cfg, training_data=data)
    assert dist.get_world_size() == 1 and engine.ctx.world_size == 1
    assert sched is engine.lr_scheduler and engine.get_lr() == [0.0]
    batches = list(loader)
    assert len(batches) == 10 and batches[0][0].shape == (4, 5)
    for x, y in batches:
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == 10 and engine.get_lr() == [pytest.approx(0.1)]
    assert opt is engine.optimizer and len(opt.param_groups[0]["params"]) >= 1
    assert set(engine.memory_breakdown()) == {"params", "gradients", "master_params", "optimizer_states", "buffers",
                                              "host_rss", "host_peak_rss", "host_baseline_rss"}


def test_param_groups_keep_their_settings_and_client_optimizer_callable() -> None:
    model = _model()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    groups = [{"params": decay, "weight_decay": 0.5}, {"params": no_decay, "weight_decay": 0.0}]
    engine, opt, _, _ = zerorun.initialize(
        model=model, model_parameters=groups, config={**BASE, "zero_optimization": {"stage": 1}},
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    # each group's flat masters hold exactly its own parameters (and their buckets' alignment padding)
    sizes = [sum(m.numel() for m in g["params"]) for g in opt.param_groups]
    padded = [sum(b.plan.padded_numel for b in engine.parts.buckets if b.plan.group_index == i) for i in range(2)]
    assert sizes == padded
    for size, group in zip(sizes, (decay, no_decay), strict=True):
        assert 0 <= size - sum(p.numel() for p in group) < ALIGN_ELEMENTS * (len(group) + 1)
    bias_before = model[0].bias.detach().clone()
    x = torch.randn(4, 5)
    engine.backward(engine(x).sum() * 0.0)  # zero gradient: only weight decay moves parameters
    engine.step()
    assert torch.equal(model[0].bias, bias_before)  # no decay on biases


def test_errors_name_the_problem_and_the_fix() -> None:
    with pytest.raises(EngineError, match=r"\[rank 0\] optimizer.params for SGD: .*bogus") as err:
        zerorun.initialize(model=_model(), config={**BASE, "optimizer": {"type": "SGD",
                                                                         "params": {"lr": 0.1, "bogus": 1}}})
    assert "torch.optim.SGD" in (err.value.hint or "")
    engine, optimizer, _, _ = zerorun.initialize(model=_model(), config=BASE)  # forward only (a reference model)
    assert optimizer is None and engine.optimizer is None
    with pytest.raises(EngineError, match=r"engine.step\(\) on an engine built without an optimizer") as err:
        engine.step()
    assert "optimizer=" in (err.value.hint or "")
    with pytest.raises(EngineError, match="no optimizer for it to drive"):
        zerorun.initialize(model=_model(), config={**BASE, "scheduler": {"type": "WarmupLR", "params": {}}})
    with pytest.raises(EngineError, match="no engine config"):
        zerorun.initialize(model=_model())


def test_existing_process_group_is_reused() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    zerorun.initialize(model=_model(), config={**BASE, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    assert dist.group.WORLD is group
    assert os.environ.get("WORLD_SIZE") is None


def test_deepspeeds_expert_parallel_optimizer_file_name() -> None:
    """``engine._get_optimizer_ckpt_name``: DeepSpeed's file name (zerorun writes no such file; checkpoint
    tests wrap the method to see that a module-only load never asks for it)."""
    engine, *_ = zerorun.initialize(model=_model(), config={"train_micro_batch_size_per_gpu": 1,
                                                           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    assert engine._get_optimizer_ckpt_name("ckpt", "global_step3", 1) == os.path.join(
        "ckpt", "global_step3", "expp_rank_1_mp_rank_00_optim_states.pt")
