"""A small ZeRO-2 job on gloo that goes wrong on purpose, for the launcher's stall tests.

--mode skip      rank 2 skips its backward at step 3 (a data-dependent branch): its peers wait
                 in that backward's reduce-scatter, rank 2 in the step's all-reduce
--mode spin      rank 1 spins in a loop of its own at step 3 (SPIN_LINE below)
--mode healthy   a slow first step (--first_step_s), a straggler (--slow_rank sleeps
                 --slow_s every step) and a slow checkpoint save (--save_s), then success
"""

import argparse
import io
import os
import time

import torch
from torch import nn

import zerorun

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int)
p.add_argument("--mode", choices=["skip", "spin", "healthy"], required=True)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--first_step_s", type=float, default=0.0)
p.add_argument("--slow_rank", type=int, default=-1)
p.add_argument("--slow_s", type=float, default=0.0)
p.add_argument("--save_s", type=float, default=0.0)
p.add_argument("--save_dir", default=None)
args = p.parse_args()
rank = int(os.environ["RANK"])


def slow_save(obj, f, *a, **kw):  # a slow filesystem: the bytes go out in pieces, over save_s seconds
    buf = io.BytesIO()
    real_save(obj, buf, *a, **kw)
    data, pieces = buf.getvalue(), 10
    out = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f  # noqa: SIM115
    for i in range(pieces):
        out.write(data[i * len(data) // pieces:(i + 1) * len(data) // pieces])
        out.flush()
        time.sleep(args.save_s / pieces)
    if out is not f:
        out.close()


real_save = torch.save
if args.save_s:
    torch.save = slow_save

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "zero_optimization": {"stage": 2}}
engine, *_ = zerorun.initialize(model=model, config=config)
for step in range(args.steps):
    if step == 0 and args.first_step_s:
        time.sleep(args.first_step_s)  # first-step compilation, as far as the launcher can tell
    if rank == args.slow_rank:
        time.sleep(args.slow_s)
    if args.mode == "spin" and rank == 1 and step == 3:
        x = 0
        while True:  # SPIN_LINE
            x += 1
    loss = engine(torch.randn(2, 8)).square().mean()
    if not (args.mode == "skip" and rank == 2 and step == 3):
        engine.backward(loss)
    engine.step()
    if step == 2 and args.save_dir:
        engine.save_checkpoint(args.save_dir)
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
