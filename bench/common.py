"""The benchmark job, identical for every system: model, initial weights, data, loss, AdamW, meters.

Adapted from the peer benchmark harness the team used to measure DDP,
ZeroRedundancyOptimizer, FSDP2 and DeepSpeed on this kind of machine:

* model: ``layers`` x [x + fc2(GELU(fc1(x)))], fc1 = Linear(h, 4h), fc2 = Linear(4h, h)
  (fc2 weight scaled by 1/sqrt(layers)), then a Linear(h, h) head; hidden 512, 12 layers
  = 25,459,200 parameters. ``torch.manual_seed(seed)`` right before construction.
* data: step s draws the global batch x ~ N(0, 1) (global_batch x h) from a generator
  seeded with seed * 1000003 + s; target tanh(x T) for a fixed teacher T; rank r takes
  rows [r mb, (r+1) mb).
* loss: MSE over the local micro batch; gradients averaged over ranks.
* optimizer: torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
  foreach=False), no clipping, no schedule.
"""

from __future__ import annotations

import argparse
import os
import time

import psutil
import torch
import torch.nn.functional as F
from torch import nn

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
RESULT_PREFIX = "BENCH_RESULT "


class Block(nn.Module):
    def __init__(self, hidden: int, ffn_mult: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_mult * hidden)
        self.fc2 = nn.Linear(ffn_mult * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class ResMLP(nn.Module):
    def __init__(self, hidden: int, layers: int, ffn_mult: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(hidden, ffn_mult) for _ in range(layers)])
        self.head = nn.Linear(hidden, hidden)
        with torch.no_grad():
            for b in self.blocks:
                b.fc2.weight.mul_(1.0 / layers ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def build_model(args: argparse.Namespace) -> ResMLP:
    torch.manual_seed(args.seed)
    return ResMLP(args.hidden, args.layers, args.ffn_mult)


def make_adamw(params) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, foreach=False)


_TEACHER: dict[tuple[int, int], torch.Tensor] = {}


def get_batch(args: argparse.Namespace, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (args.hidden, args.seed)
    if key not in _TEACHER:
        g = torch.Generator().manual_seed(args.seed + 7919)
        _TEACHER[key] = torch.randn(args.hidden, args.hidden, generator=g) / args.hidden ** 0.5
    mb = args.global_batch // world
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(args.global_batch, args.hidden, generator=g)
    y = torch.tanh(x @ _TEACHER[key])
    return x[rank * mb:(rank + 1) * mb].contiguous(), y[rank * mb:(rank + 1) * mb].contiguous()


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y)


def base_parser(desc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=desc)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--ffn-mult", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=128, help="samples per micro-step over all ranks")
    p.add_argument("--gas", type=int, default=1,
                   help="gradient accumulation steps: micro-batches (of --global-batch) per optimizer step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=0, help="threads per rank (0: cores // world)")
    return p


def setup_threads(args: argparse.Namespace, world: int) -> int:
    n = args.threads if args.threads > 0 else max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(n)
    return n


def vm_hwm_bytes() -> int:
    """Kernel high-water mark of this process's RSS."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def tensor_bytes_dedup(tensors) -> int:
    """Storage bytes of the given tensors, each storage once (DTensors: the local shard)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if key not in seen and st.nbytes():
            seen.add(key)
            total += st.nbytes()
    return total


def optimizer_state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]


class Meter:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self, loss: float) -> None:
        self.step_times.append(time.perf_counter() - self._t0)
        self.losses.append(loss)
