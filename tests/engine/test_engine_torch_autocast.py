"""``torch_autocast``: fp32 parameters, masters and gradients, the forward under ``torch.autocast`` in
bfloat16 (DeepSpeed 0.19.8's semantics). World 2 at stages 1 and 3 against one process running the
same model under ``torch.autocast`` on the whole batch, step by step."""

from __future__ import annotations

import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed

STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), y)


def _reference() -> tuple[list[float], list[torch.Tensor], list[torch.dtype]]:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = _data()
    losses, dtypes = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        dtypes.append(out.dtype)
        loss = _loss(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()], dtypes


def _rank(rank: int, world: int) -> dict:
    x, y = _data()
    x, y = x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]
    results = {}
    for stage in (1, 3):
        model = _model()
        cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": {"stage": stage},
               "torch_autocast": {"enabled": True, "dtype": "bfloat16"},
               "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
        engine, *_ = zerorun.initialize(model=model, config=cfg)
        losses, dtypes = [], []
        for _ in range(STEPS):
            out = engine(x)
            dtypes.append(out.dtype)
            loss = _loss(out, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            params = [p.detach().clone() for p in model.parameters()]
        results[stage] = {"losses": losses, "params": params, "dtypes": dtypes,
                          "param_dtypes": {p.dtype for p in model.parameters()}}
        engine.destroy()
    return results


def test_torch_autocast_trains_as_autocast_in_one_process() -> None:
    ref_losses, ref_params, ref_dtypes = _reference()
    assert ref_dtypes == [torch.bfloat16] * STEPS  # the case: the forward really ran in bf16
    per_rank = run_distributed(_rank, 2, timeout=240)
    for stage in (1, 3):
        got = [r[stage] for r in per_rank]
        assert all(g["dtypes"] == ref_dtypes and g["param_dtypes"] == {torch.float32} for g in got)
        for step in range(STEPS):  # the global-batch loss is the mean of the two micro-batch losses
            mean = (got[0]["losses"][step] + got[1]["losses"][step]) / 2
            assert abs(mean - ref_losses[step]) <= 2**-8 * abs(ref_losses[step]), (stage, step)
        for p, want in zip(got[0]["params"], ref_params, strict=True):
            torch.testing.assert_close(p, want, rtol=2**-7, atol=0.01 * 0.1 * STEPS)
