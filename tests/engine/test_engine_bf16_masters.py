"""bf16 masters, gradients and moments (``bf16.bf16_master_weights_and_grads`` + ``bf16_optimizer_states``):
world 2 at stages 1 and 3, and stage 2 with cpu offload, against one process stepping torch AdamW on a bf16
model over the whole batch - what DeepSpeed 0.19.8 does with these keys: its bf16 partition is the
optimizer's parameter, so the moments are made bf16 too."""

from __future__ import annotations

import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed

STEPS = 3
BOTH = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _reference() -> tuple[list[float], list[torch.Tensor]]:
    model = _model().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = _data()
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.bfloat16()).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().float().clone() for p in model.parameters()]


CASES = {"z1": {"stage": 1}, "z3": {"stage": 3},
         "z2-cpu": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def _rank(rank: int, world: int) -> dict:
    x, y = _data()
    x, y = x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]
    results = {}
    for name, zero in CASES.items():
        model = _model()
        cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": zero,
               "bf16": BOTH, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
        engine, opt, *_ = zerorun.initialize(model=model, config=cfg)
        losses = []
        for _ in range(STEPS):
            loss = nn.functional.mse_loss(engine(x.bfloat16()).float(), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            params = [p.detach().float().clone() for p in model.parameters()]
        state_dtypes = {v.dtype for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()}
        master_dtypes = {p.dtype for g in opt.param_groups for p in g["params"]}
        results[name] = {"losses": losses, "params": params, "state": state_dtypes, "masters": master_dtypes}
        engine.destroy()
    return results


def test_bf16_masters_grads_and_moments_train_as_a_bf16_model_in_one_process() -> None:
    ref_losses, ref_params = _reference()
    per_rank = run_distributed(_rank, 2, timeout=240)
    for name in CASES:
        got = [r[name] for r in per_rank]
        assert all(g["state"] == {torch.bfloat16} and g["masters"] == {torch.bfloat16} for g in got), name
        for step in range(STEPS):  # the global-batch loss is the mean of the two micro-batch losses
            mean = (got[0]["losses"][step] + got[1]["losses"][step]) / 2
            assert abs(mean - ref_losses[step]) < 2e-2 * max(1.0, abs(ref_losses[step])), (name, step)
        for p, q in zip(got[0]["params"], ref_params, strict=True):  # within a few bf16 ulps
            torch.testing.assert_close(p, q, atol=2e-2, rtol=2e-2, msg=name)
