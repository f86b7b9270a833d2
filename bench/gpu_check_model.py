"""The GPU check's model and reference: the tied-embedding GPT of examples/train_gpt.py at the check's
sizes, its batches and config, plain PyTorch's training of it, and the comparison of the two."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import zerorun
from zerorun.engine.training.host_kernel import kernel_kwargs

ROOT = Path(__file__).resolve().parents[1]

LR = 1e-3


@dataclass(frozen=True)
class GPT:
    vocab: int
    block: int
    dim: int
    layers: int
    heads: int
    batch: int


@dataclass(frozen=True)
class Sizes:
    parity: GPT
    memory: GPT
    steps: int
    throughput: GPT


GPU_SIZES = Sizes(GPT(512, 64, 256, 4, 8, 8), GPT(16384, 256, 768, 12, 12, 4), steps=5,
                  throughput=GPT(32000, 1024, 2048, 16, 16, 4))
CPU_SIZES = Sizes(GPT(48, 8, 16, 2, 2, 2), GPT(64, 8, 32, 2, 2, 2), steps=3, throughput=GPT(64, 16, 32, 2, 2, 2))


def _example_gpt() -> Any:
    spec = importlib.util.spec_from_file_location("zerorun_example_gpt", ROOT / "examples" / "train_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TinyGPT


TinyGPT = _example_gpt()


def make_model(g: GPT) -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyGPT(g.vocab, g.block, g.dim, g.layers, g.heads)


def batch(g: GPT, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step % 2)  # two batches, revisited: the loss falls
    tokens = torch.randint(0, g.vocab, (g.batch, g.block + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def config(g: GPT, stage: int, dtype: str, **zero: Any) -> dict[str, Any]:
    """World size 1, AdamW; small buckets (several per model) unless ``zero`` says otherwise."""
    zero = {"reduce_bucket_size": 200_000, "overlap_comm": stage >= 2, **zero}
    return {
        "train_micro_batch_size_per_gpu": g.batch,
        "steps_per_print": 10**9, "gradient_clipping": 0.0,  # the reference does not clip
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
        "bf16": {"enabled": dtype == "bf16"},
        "zero_optimization": {"stage": stage, **zero},
    }


# ---- training ---------------------------------------------------------------------------------
def reference(g: GPT, dtype: str, steps: int, device: torch.device,
              host_step: bool = False) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch: fp32 master weights, the forward and backward in ``dtype``.

    ``host_step``: the masters live on the CPU and step with the kernel the engine picks for
    offloaded masters (torch's fused CPU AdamW), as ``offload_optimizer`` does. Kernels round
    differently (a few ulps a step), and the attention's key bias, whose exact gradient is zero,
    gets Adam steps of normalized rounding noise: one ulp of difference at step 1 becomes
    ~5e-5 by step 5, 5x the fp32 tolerance (seen on CPU and on an H200). So the reference steps
    where and how the engine does, and the tolerance stays fp32's."""
    master = make_model(g).to("cpu" if host_step else device)
    compute = make_model(g).to(device).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    params = list(master.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0,
                            **kernel_kwargs(torch.optim.AdamW, {}, host_step=host_step))
    losses = []
    for step in range(steps):
        x, y = batch(g, step, device)
        compute.zero_grad(set_to_none=True)
        loss = loss_of(compute(x), y)
        loss.backward()
        losses.append(float(loss.detach()))
        for p, c in zip(params, compute.parameters(), strict=True):
            p.grad = torch.zeros_like(p) if c.grad is None else c.grad.float().to(p.device)
        opt.step()
        with torch.no_grad():
            for p, c in zip(params, compute.parameters(), strict=True):
                c.copy_(p)
    return losses, {n: p.detach().float().cpu() for n, p in master.named_parameters()}


def train(engine: Any, g: GPT, first: int, steps: int) -> list[float]:
    losses = []
    for step in range(first, first + steps):
        x, y = batch(g, step, engine.device)
        loss = loss_of(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def params_of(engine: Any) -> dict[str, torch.Tensor]:
    with zerorun.zero.GatheredParameters(list(engine.module.parameters())):
        return {n: p.detach().float().cpu().clone() for n, p in engine.module.named_parameters()}


def placement(engine: Any) -> dict[str, list[str]]:
    """Device types of the gathered parameters, and of the gradients the engine reduces."""
    with zerorun.zero.GatheredParameters(list(engine.module.parameters())):
        params = sorted({p.device.type for p in engine.module.parameters()})
    return {"params": params, "buckets": sorted({b.data.device.type for b in engine.parts.buckets})}


def build(g: GPT, cfg: dict[str, Any], zero_init: bool = False) -> Any:
    if zero_init:
        with zerorun.zero.Init(config=cfg):
            model = make_model(g)
    else:
        model = make_model(g)
    engine, _, _, _ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def compare(dtype: str, steps: int, losses: list[float], params: dict[str, torch.Tensor],
            ref: tuple[list[float], dict[str, torch.Tensor]]) -> dict[str, Any]:
    ref_losses, ref_params = ref
    rtol = 1e-5 if dtype == "fp32" else 2**-8
    loss_err = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses, strict=True))
    prtol, patol = (1e-5, 1e-5) if dtype == "fp32" else (2**-7, 0.1 * LR * steps)
    worst = 0.0  # the largest |got - want| / (atol + rtol |want|): <= 1 passes
    for name, want in ref_params.items():
        got = params[name]
        worst = max(worst, float(((got - want).abs() / (patol + prtol * want.abs())).max()))
    return {"passed": loss_err <= rtol and worst <= 1.0 and set(params) == set(ref_params),
            "loss_rel_err": loss_err, "loss_rtol": rtol, "param_err_over_tol": worst,
            "losses": losses, "ref_losses": ref_losses}
