"""The toy model of the docs: a 12-layer residual MLP on random data, trained with zerorun.

    zerorun --num_gpus 2 examples/train_toy.py --config templates/zero2.yaml
    torchrun --standalone --nproc_per_node 2 examples/train_toy.py --config templates/zero2.yaml
    zerorun --num_gpus 2 --config templates/zero1.yaml examples/train_toy.py   # config via ZERORUN_CONFIG

The optimizer (AdamW in the templates), precision and ZeRO stage come from the config.
Each step draws a fresh batch x ~ N(0, 1) with target tanh(x T) for a fixed teacher T,
so the loss falls as the model learns T. Every rank sees its own rows of the global batch.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import zerorun
from zerorun.engine.metrics import format_memory


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class ToyMLP(nn.Module):
    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, hidden)
        with torch.no_grad():  # keep the residual stream well scaled
            for b in self.blocks:
                b.fc2.weight.mul_(layers ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batch(step: int, rank: int, world: int, micro: int, hidden: int, teacher: torch.Tensor):
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(micro * world, hidden, generator=g)[rank * micro:(rank + 1) * micro]
    return x, torch.tanh(x @ teacher)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--print-every", type=int, default=None,
                        help="print the mean loss every N steps (default: only when the engine's own progress line, "
                             "config steps_per_print, is off; the engine's line shows the last micro batch's loss)")
    zerorun.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = ToyMLP(args.hidden, args.layers)
    teacher = torch.randn(args.hidden, args.hidden, generator=torch.Generator().manual_seed(7)) / args.hidden ** 0.5
    engine, _, _, _ = zerorun.initialize(args=args, model=model, model_parameters=model.parameters())
    rank, world = engine.ctx.rank, engine.ctx.world_size
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"toy MLP: {n:,} parameters, ZeRO stage {engine.zero_stage}, {engine.precision.name}, "
              f"{world} ranks x micro batch {micro} x {gas} accumulation steps", flush=True)
    # One progress line: the engine's (every steps_per_print steps, the last micro batch's loss), or, with it
    # off or with --print-every, this script's mean over the micro batches since its last line (less noisy).
    engine_prints = engine.config.steps_per_print not in (None, 0) and engine.config.steps_per_print < float("inf")
    every = args.print_every or (0 if engine_prints else 5)
    window: list[float] = []
    first: float | None = None
    for step in range(args.steps):
        for k in range(gas):
            x, y = batch(step * gas + k, rank, world, micro, args.hidden, teacher)
            x, y = x.to(engine.device), y.to(engine.device)  # the rank's GPU (or the CPU on gloo)
            x = x.to(engine.precision.compute_dtype)  # the parameters' dtype: the engine casts no input
            loss = F.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            window.append(loss.item())
        if step == 0:
            engine.reset_memory_peak()  # the peak of the steps that follow: set-up and first-step costs left out
            first = sum(window) / len(window)
        if rank == 0 and every and ((step + 1) % every == 0 or step == args.steps - 1):
            print(f"step {step + 1:3d}  mean loss of {len(window)} micro batches {sum(window) / len(window):.4f}  "
                  f"lr {engine.get_lr()[0]:.2e}", flush=True)
        if every and (step + 1) % every == 0:
            window.clear()
    if rank == 0 and window and first is not None and not every:
        print(f"loss: {first:.4f} in step 1 -> {sum(window[-gas:]) / len(window[-gas:]):.4f} in step {args.steps} "
              f"(means over each step's {gas} micro batch(es))", flush=True)
    if rank == 0:
        print(f"memory per rank: {format_memory(engine.memory_breakdown())}", flush=True)
    held = held_line(engine)
    if rank == 0 and held:
        print(held, flush=True)


def held_line(engine: Any) -> str | None:
    """What the worse rank held physically, against plain data parallel on this model (every rank calls it)."""
    import torch.distributed as dist

    from zerorun.engine.physical_memory import physical_figures
    from zerorun.engine.trial import measured_facts
    from zerorun.estimate.measure import against_ddp

    ranks: list[dict[str, int] | None] = [None] * engine.ctx.world_size
    dist.all_gather_object(ranks, physical_figures(engine.device), group=engine.ctx.group)
    return against_ddp({**measured_facts(engine), "physical_per_rank": ranks, "stage": engine.zero_stage,
                        "world_size": engine.ctx.world_size, "num_parameters": engine.num_parameters()})


if __name__ == "__main__":
    main()
