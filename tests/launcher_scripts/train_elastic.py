"""An elastic run's rank: a tiny ZeRO-2 model, global batch 12 (micro batch 2) at any world,
48 samples with ids, 8 steps (two epochs), a checkpoint every 2 steps; resumes from CKPT's
``latest``. ``--kill A:R:S``: on attempt A (ZERORUN_RESTART_COUNT) rank R SIGKILLs itself right
after step S (and writes its time of death to CKPT/../failed_at<A>). Every rank appends one JSON line per
micro batch to LOG/rank<R>.jsonl: attempt, world, the step it belongs to, the epoch and the
sample ids; rank 0 adds the micro batch's loss and prints `step N t=<time>` per step."""

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import zerorun

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int)
p.add_argument("--ckpt", required=True)
p.add_argument("--log", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--save_every", type=int, default=2)
p.add_argument("--kill", action="append", default=[], metavar="ATTEMPT:RANK:STEP")
args = p.parse_args()
kills = {tuple(int(v) for v in k.split(":")) for k in args.kill}
torch.set_num_threads(1)

torch.manual_seed(0)
data = TensorDataset(torch.arange(48), torch.randn(48, 6), torch.randn(48, 3))
model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
config = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
          "zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam", "params": {"lr": 0.02}}}
engine, _, loader, _ = zerorun.initialize(model=model, config=config, training_data=data)
rank, world = engine.ctx.rank, engine.ctx.world_size
if (Path(args.ckpt) / "latest").is_file():
    engine.load_checkpoint(args.ckpt)
attempt = int(os.environ.get("ZERORUN_RESTART_COUNT", "0"))
log = Path(args.log) / f"rank{rank}.jsonl"

epoch = loader.epoch
while engine.global_steps < args.steps:
    loader.set_epoch(epoch)
    for ids, x, y in loader:
        loss = nn.functional.mse_loss(engine(x), y)
        record = {"attempt": attempt, "world": world, "step": engine.global_steps + 1, "epoch": epoch,
                  "ids": ids.tolist(), "loss": repr(loss.item()) if rank == 0 else None}
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")
        engine.backward(loss)
        before = engine.global_steps
        engine.step()
        step = engine.global_steps
        if step == before:
            continue
        if rank == 0:
            print(f"step {step} t={time.time():.3f} world {world} samples {engine.global_samples}", flush=True)
        if step % args.save_every == 0:
            engine.save_checkpoint(args.ckpt)
        if (attempt, rank, step) in kills:
            (Path(args.ckpt).parent / f"failed_at{attempt}").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.steps:
            break
    epoch += 1
