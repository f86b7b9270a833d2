"""A tiny ZeRO-2 training run that resumes: loads CKPT's `latest` when there is one, trains
to --steps (crossing an epoch boundary), checkpoints every --save_every steps, and on the
first attempt (ZERORUN_RESTART_COUNT 0 or unset) rank --kill_rank SIGKILLs itself right
after step --kill_at. Rank 0 writes the final parameters to --out. Every step prints
`step N t=<time>`; the killed rank writes its time of death to CKPT/../failed_at."""

import argparse
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import zerorun

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int)  # passed by the launcher, as DeepSpeed's does
p.add_argument("--ckpt", required=True)
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=14)
p.add_argument("--save_every", type=int, default=3)
p.add_argument("--kill_rank", type=int, default=-1)
p.add_argument("--kill_at", type=int, default=7)
args = p.parse_args()
torch.set_num_threads(1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(40, 6), torch.randn(40, 3))  # 10 micro batches of 2 per rank and epoch at world 2
model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "Adam", "params": {"lr": 0.02}}}
engine, _, loader, _ = zerorun.initialize(model=model, config=config, training_data=data)
rank = engine.ctx.rank
if (Path(args.ckpt) / "latest").is_file():
    engine.load_checkpoint(args.ckpt)
first_attempt = os.environ.get("ZERORUN_RESTART_COUNT", "0") == "0"

epoch = loader.epoch
while engine.global_steps < args.steps:
    loader.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        step = engine.global_steps
        if rank == 0:
            print(f"step {step} t={time.time():.3f} loss {loss.item():.6f}", flush=True)
        if step % args.save_every == 0:
            engine.save_checkpoint(args.ckpt)
        if first_attempt and rank == args.kill_rank and step == args.kill_at:
            (Path(args.ckpt).parent / "failed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.steps:
            break
    epoch += 1

if rank == 0:
    torch.save({n: t.detach().clone() for n, t in engine.module.state_dict().items()}, args.out)
