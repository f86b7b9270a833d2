"""4-rank (any size) gloo job: all-reduce of rank+1 must equal W(W+1)/2 on every rank."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} local {os.environ['LOCAL_RANK']} node {os.environ['NODE_RANK']} "
      f"sum {t.item():.0f} args {sys.argv[1:]} cvd {os.environ.get('CUDA_VISIBLE_DEVICES')} "
      f"config {os.environ.get('ZERORUN_CONFIG')}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if t.item() == expected else 3)
