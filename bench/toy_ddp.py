"""Plain DDP on the README's main job's model (examples/train_toy.py's ToyMLP), for bench/first_hour.py.

    torchrun --standalone --nproc_per_node 2 bench/toy_ddp.py --steps 60

The same model, micro batch, data and AdamW settings as templates/zero2.yaml, in fp32
(plain DDP as a user writes it) or under bf16 autocast (``--bf16``). Rank 0 prints the
mean step time (optimizer step to optimizer step) of every 10 steps, in the engine's
words (``| N ms/step``), so one parser reads both systems.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_toy import ToyMLP, batch  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = DistributedDataParallel(ToyMLP(args.hidden, args.layers))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    teacher = torch.randn(args.hidden, args.hidden, generator=torch.Generator().manual_seed(7)) / args.hidden ** 0.5
    last, window = time.perf_counter(), []
    for step in range(args.steps):
        x, y = batch(step, rank, world, args.micro, args.hidden, teacher)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        now = time.perf_counter()
        window.append(now - last)
        last = now
        if (step + 1) % 10 == 0:
            if rank == 0:
                print(f"step {step + 1} | {sum(window) / len(window) * 1000:.1f} ms/step", flush=True)
            window.clear()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
