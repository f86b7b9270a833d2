"""bf16.master_compensation: 300 small-lr steps at world 2 (stage 2), where updates of ~1e-3 on weights of
magnitude ~1 are below half a bf16 ulp (2^-9 relative): plain bf16 masters stall, fp32 masters do not, and
each compensated mode ends closer to the fp32-master run than plain bf16 does. A 128-parameter model."""

from __future__ import annotations

import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed

STEPS = 300
MODES = ("fp32", "none", "kahan", "stochastic_rounding")


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(16, 8, bias=False)
    with torch.no_grad():
        model.weight.normal_(0.0, 1.0)  # magnitudes ~1: the bf16 ulp is 2^-7 .. 2^-8 there
    return model


def _teacher() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return _model().weight.detach() + 0.05 * torch.randn(8, 16, generator=g)


def _rank(rank: int, world: int) -> dict[str, float]:
    teacher = _teacher()
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(8, 16, generator=g) for _ in range(STEPS)]
    final = {}
    for mode in MODES:
        bf16 = {"enabled": True}
        if mode != "fp32":
            bf16 |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True,
                     "master_compensation": mode}
        cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": {"stage": 2},
               "bf16": bf16, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
        model = _model()
        engine, *_ = zerorun.initialize(model=model, config=cfg)
        for x in batches:
            x = x[rank * 4:(rank + 1) * 4]
            loss = nn.functional.mse_loss(engine(x.bfloat16()).float(), x @ teacher.T)
            engine.backward(loss)
            engine.step()
        with torch.no_grad():  # the loss of the trained weights, in fp32, on a fixed probe
            probe = torch.randn(64, 16, generator=torch.Generator().manual_seed(9))
            final[mode] = nn.functional.mse_loss(probe @ model.weight.float().T, probe @ teacher.T).item()
        engine.destroy()
    return final


def test_compensated_bf16_masters_end_closer_to_fp32_masters_than_plain_bf16() -> None:
    final = run_distributed(_rank, 2, timeout=240)[0]
    start = nn.functional.mse_loss(_model().weight, _teacher()).item()  # the scale: 0.05^2
    assert final["fp32"] < 0.5 * final["none"], final  # the case: plain bf16 masters measurably stall
    assert final["none"] > 0.5 * start, (final, start)
    for mode in ("kahan", "stochastic_rounding"):
        assert abs(final[mode] - final["fp32"]) < 0.5 * abs(final["none"] - final["fp32"]), (mode, final)
