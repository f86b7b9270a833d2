"""A small ZeRO-2 job on gloo that goes wrong on purpose, for the launcher's stall tests.

--skip_rank R    rank R skips its backward at step 3 (a data-dependent branch): its peers wait
                 in that backward's reduce-scatter, rank R in the step's all-reduce
--spin_rank R    rank R spins in a loop of its own at step 3 (SPIN_LINE below)
--sleep_rank R   rank R sleeps --sleep_s after initialize(), before its first step (SLEEP_LINE):
                 its peers wait in the first step's reduce-scatter, during set-up
otherwise        a slow first step (--first_step_s), a straggler (--slow_rank sleeps
                 --slow_s every step) and a slow checkpoint save on rank 0 (--save_s: its
                 peers wait for it in the save's closing collective), then success
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
p.add_argument("--skip_rank", type=int, default=-1)
p.add_argument("--spin_rank", type=int, default=-1)
p.add_argument("--sleep_rank", type=int, default=-1)
p.add_argument("--sleep_s", type=float, default=0.0)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--first_step_s", type=float, default=0.0)
p.add_argument("--slow_rank", type=int, default=-1)
p.add_argument("--slow_s", type=float, default=0.0)
p.add_argument("--save_s", type=float, default=0.0)
p.add_argument("--save_dir", default=None)
args = p.parse_args()
rank = int(os.environ["RANK"])


def slow_save(obj, f, *a, **kw):  # a slow filesystem: the save's first file goes out in pieces, over save_s seconds
    global slow_left
    buf = io.BytesIO()
    real_save(obj, buf, *a, **kw)
    data, pieces = buf.getvalue(), 10
    pause, slow_left = slow_left / pieces, 0.0  # a save writes several files: the first takes the whole time
    out = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f  # noqa: SIM115
    for i in range(pieces):
        out.write(data[i * len(data) // pieces:(i + 1) * len(data) // pieces])
        out.flush()
        time.sleep(pause)
    if out is not f:
        out.close()


real_save, slow_left = torch.save, args.save_s
if args.save_s and rank == 0:
    torch.save = slow_save

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
          "zero_optimization": {"stage": 2}}
engine, *_ = zerorun.initialize(model=model, config=config)
if rank == args.sleep_rank:
    time.sleep(args.sleep_s)  # SLEEP_LINE
for step in range(args.steps):
    if step == 0 and args.first_step_s:
        time.sleep(args.first_step_s)  # first-step compilation, as far as the launcher can tell
    if rank == args.slow_rank:
        time.sleep(args.slow_s)
    if rank == args.spin_rank and step == 3:
        x = 0
        while True:  # SPIN_LINE
            x += 1
    loss = engine(torch.randn(2, 8)).square().mean()
    if not (rank == args.skip_rank and step == 3):
        engine.backward(loss)
    engine.step()
    if step == 2 and args.save_dir:
        engine.save_checkpoint(args.save_dir)
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
