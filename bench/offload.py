"""Measure optimizer offload on the toy MLP: step time and peak process memory per placement.

    python bench/offload.py                 # none / cpu / nvme, one fresh process each
    python bench/offload.py --kernels       # one host AdamW step: for-loop, foreach, fused, zerorun's, DeepSpeedCPUAdam
    python bench/offload.py --kernels --ds-python /path/to/deepspeed-venv/bin/python   # + DeepSpeed's own
    python bench/offload.py --kernels --ds-python ... --repeat 3   # 3 alternated rounds (a loaded machine)

Each placement runs in its own process (world size 1, fp32, ZeRO stage 2) so that the
peak resident set size (``ru_maxrss``) is that placement's alone.
"""

from __future__ import annotations

import argparse
import json
import os
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


KERNELS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
HOST_STEP = "zerorun host step"  # the kernel the engine picks, on masters and state placed as the engine does


def _adamw(name: str, p: nn.Parameter) -> torch.optim.Optimizer:
    if name == HOST_STEP:  # optimizer.type AdamW in the config, masters offloaded to cpu
        from zerorun.engine.training.optim_factory import build_optimizer

        return build_optimizer("AdamW", {"lr": 1e-4, "weight_decay": 0.01}, [p], host_step=True)
    if name == "zerorun DeepSpeedCPUAdam":  # deepspeed.ops.adam's class as zerorun provides it
        from zerorun.compat.optimizers import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam([p], lr=1e-4, weight_decay=0.01)
    if name == "DeepSpeedCPUAdam":  # DeepSpeed's own (SIMD C++, JIT-built on first use)
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam([p], lr=1e-4, weight_decay=0.01, adamw_mode=True)
    return torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, **KERNELS[name])


def kernels(numel: int, steps: int, names: list[str]) -> list[dict]:
    """ms per AdamW step of ``numel`` fp32 elements on one thread, each kernel on the same tensors: wall
    time, and the process's CPU time (one thread: the kernel's own work, less moved by other jobs' load)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start, grad = torch.randn(numel), torch.randn(numel)
    out = []
    for name in names:
        p = nn.Parameter(start.clone())
        p.grad = grad.clone()
        if name == HOST_STEP:
            from zerorun.engine.offload import hugepages

            p.data = hugepages.huge_copy(p.data)  # HostMasters' set-up
        opt = _adamw(name, p)
        opt.step()
        if name == HOST_STEP:
            hugepages.settle_state(opt, [p])  # HostMasters.step, after the step that made the state
        times, cpu = [], []
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            opt.step()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out.append({"kernel": name, "numel": numel, "step_ms": 1000 * statistics.median(times),
                    "cpu_ms": 1000 * statistics.median(cpu), "ns_per_param": 1e9 * statistics.median(times) / numel})
    return out


def _ds_kernel(numel: int, steps: int, ds_python: str) -> list[dict]:
    """DeepSpeedCPUAdam itself, in its own environment (DeepSpeed is no dependency); its bin first on PATH:
    the cached op."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore",
           "PATH": os.pathsep.join([os.path.dirname(ds_python), os.environ.get("PATH", "")])}
    done = subprocess.run([ds_python, __file__, "--kernel-one", "DeepSpeedCPUAdam", "--numel", str(numel),
                           "--steps", str(steps)], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_kernels(numel: int, steps: int, ds_python: str | None, repeat: int = 1) -> None:
    """The table; with ``repeat`` > 1 the kernels run in that many alternated rounds (a load change on a shared
    machine then hits every kernel), each round's figure given, the median of the rounds first."""
    rounds: list[list[dict]] = []
    for _ in range(repeat):
        rows = kernels(numel, steps, [*KERNELS, HOST_STEP, "zerorun DeepSpeedCPUAdam"])
        rounds.append(rows + (_ds_kernel(numel, steps, ds_python) if ds_python else []))
    print(f"one AdamW step, {numel:,} fp32 elements, 1 thread, median of {steps} steps"
          + (f", {repeat} alternated rounds (median, then each round)" if repeat > 1 else "") + ":")
    print("| kernel | ms / step | ns / parameter | CPU ms / step |" + (" rounds, ms (CPU ms) |" if repeat > 1 else "")
          + "\n|---|---:|---:|---:|" + ("---|" if repeat > 1 else ""))
    for k, row in enumerate(rounds[0]):
        ms, cpu = [r[k]["step_ms"] for r in rounds], [r[k]["cpu_ms"] for r in rounds]
        each = f" {' / '.join(f'{m:.1f} ({c:.1f})' for m, c in zip(ms, cpu, strict=True))} |" if repeat > 1 else ""
        print(f"| {row['kernel']} | {statistics.median(ms):.1f} | {1e6 * statistics.median(ms) / numel:.2f} | "
              f"{statistics.median(cpu):.1f} |{each}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--one", choices=["none", "cpu", "nvme"], help=argparse.SUPPRESS)
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--numel", type=int, default=25_459_200, help="--kernels: elements (the peers' 25M model)")
    parser.add_argument("--ds-python", help="--kernels: a Python with deepspeed, for DeepSpeedCPUAdam itself")
    parser.add_argument("--repeat", type=int, default=1, help="--kernels: alternated rounds of every kernel")
    parser.add_argument("--kernel-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.hidden, args.layers, args.steps)))
        return
    if args.kernel_one:
        sys.path.pop(0)  # bench/ itself: nothing there may shadow the other environment's packages
        print(json.dumps(kernels(args.numel, args.steps, [args.kernel_one])))
        return
    if args.kernels:
        print_kernels(args.numel, args.steps, args.ds_python, args.repeat)
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
