"""Measure optimizer offload on the toy MLP: step time and peak process memory per placement.

    python bench/offload.py                 # none / cpu / nvme, one fresh process each
    python bench/offload.py --kernels       # CPU AdamW: for-loop vs foreach vs fused

Each placement runs in its own process (world size 1, fp32, ZeRO stage 2) so that the
peak resident set size (``ru_maxrss``) is that placement's alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
import torch
from torch import nn


def toy(hidden: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)]
    return nn.Sequential(*blocks, nn.Linear(hidden, hidden))


def config(placement: str, swap: str) -> dict:
    zero: dict = {"stage": 2, "reduce_bucket_size": 2**22}
    if placement == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    elif placement == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": swap, "buffer_count": 4}
    return {"train_micro_batch_size_per_gpu": 16, "steps_per_print": 10**6, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


def one(placement: str, hidden: int, layers: int, steps: int) -> dict:
    import zerorun

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as swap:
        engine, _, _, _ = zerorun.initialize(model=toy(hidden, layers), config=config(placement, swap))
        x = torch.randn(16, hidden, device="cpu")
        times = []
        for step in range(steps + 2):
            t0 = time.perf_counter()
            engine.backward(engine(x).square().mean())
            engine.step()
            if step >= 2:
                times.append(time.perf_counter() - t0)
        params = engine.num_parameters()
        rss_between_steps = psutil.Process().memory_info().rss / 2**20
    return {"placement": placement, "params": params, "step_ms": 1000 * statistics.median(times),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_between_steps_mib": rss_between_steps}


def kernels(numel: int, steps: int) -> list[dict]:
    out = []
    for name, kwargs in (("for-loop", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        p = nn.Parameter(torch.randn(numel, device="cpu"))
        p.grad = torch.randn(numel, device="cpu")
        opt = torch.optim.AdamW([p], lr=1e-4, **kwargs)
        opt.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.step()
        out.append({"kernel": name, "numel": numel, "step_ms": 1000 * (time.perf_counter() - t0) / steps})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--one", choices=["none", "cpu", "nvme"], help=argparse.SUPPRESS)
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.hidden, args.layers, args.steps)))
        return
    if args.kernels:
        for row in kernels(16 * 2**20, args.steps):
            print(f"AdamW {row['kernel']:8s} {row['numel']:,} fp32 elements: {row['step_ms']:.1f} ms/step")
        return
    for placement in ("none", "cpu", "nvme"):
        done = subprocess.run([sys.executable, __file__, "--one", placement,
                               "--hidden", str(args.hidden), "--layers", str(args.layers), "--steps", str(args.steps)],
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"offload {row['placement']:5s} {row['params']:,} params: step {row['step_ms']:.0f} ms, "
              f"peak RSS {row['peak_rss_mib']:.0f} MiB, RSS between steps {row['rss_between_steps_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
