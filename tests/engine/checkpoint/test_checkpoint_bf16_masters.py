"""Checkpoints of bf16 masters, gradients and moments (``bf16.bf16_master_weights_and_grads`` +
``bf16_optimizer_states``): a resume continues exactly where the run was (masters, bf16 moments, the Kahan
buffer of ``master_compensation: kahan``, on the device, offloaded to cpu and to nvme), and ``zerorun convert`` gives the
fp32 state dict of the bf16 masters. World 1, in this process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import zerorun
from zerorun.cli import main

BOTH = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
NVME = {"device": "nvme", "nvme_path": "<tmp>", "buffer_count": 2}
CASES = {"z3-kahan": ({"stage": 3}, "kahan"), "z2-cpu": ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "none"),
         "z3-nvme": ({"stage": 3, "offload_optimizer": NVME, "offload_param": NVME}, "none")}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))


def _engine(zero: dict, compensation: str):
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": zero,
           "bf16": {**BOTH, "master_compensation": compensation},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    model = _model()
    engine, opt, *_ = zerorun.initialize(model=model, config=cfg)
    return engine, opt, model


def _train(engine, steps: range) -> list[float]:
    losses = []
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        loss = nn.functional.mse_loss(engine(x.bfloat16()).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_continues_exactly_and_convert_gives_fp32(tmp_path: Path, case: str) -> None:
    zero, compensation = CASES[case]
    swap = tmp_path / "swap"
    zero = {k: {**v, "nvme_path": str(swap)} if isinstance(v, dict) else v for k, v in zero.items()}
    tmp_path = tmp_path / "ckpt"
    engine, opt, model = _engine(zero, compensation)
    _train(engine, range(3))
    engine.save_checkpoint(str(tmp_path))
    kept = _train(engine, range(3, 6))
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        masters = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine.destroy()

    resumed, ropt, _ = _engine(zero, compensation)
    resumed.load_checkpoint(str(tmp_path))
    states = {v.dtype for s in ropt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()}
    assert states == {torch.bfloat16}, states  # bf16 moments (and Kahan buffer) came back as bf16
    assert _train(resumed, range(3, 6)) == kept  # the same masters, moments and compensation
    resumed.destroy()

    out = tmp_path / "model.pt"
    assert main(["convert", str(tmp_path), str(out)]) == 0
    state = torch.load(out, weights_only=True)
    assert {v.dtype for v in state.values()} == {torch.float32}
    plain = _model()
    plain.load_state_dict(state, strict=True)
    trained_at_3 = {k: v.float() for k, v in masters.items()}  # after 6 steps; the checkpoint holds step 3's
    assert any(not torch.equal(state[k], trained_at_3[k]) for k in state)
    for v in state.values():  # an fp32 copy of bf16 masters: every value is a bf16 value
        assert torch.equal(v, v.bfloat16().float())
