"""The offload step's pipeline over chunks, timed on the CPU with a stand-in copy engine.

    python bench/offload_pipeline.py                       # 8 chunks of 1M fp32, copies at 2 GB/s
    python bench/offload_pipeline.py --gbps 1 --layers 8 --repeat 3

No GPU here, so the host<->device copies are played by a stand-in: every ``non_blocking``
copy the offload issues (through :class:`zerorun.engine.offload.copies.Transfers`) runs on one
background thread, in issue order (a CUDA stream), after an injected delay of its bytes over
``--gbps`` (the PCIe link), and a fence waits for it. "Device" tensors are the ones the
stand-in did not allocate, as in ``ZERORUN_CHECK_COPIES=deferred``. Two arms, same process,
same engine build, alternated: ``pipelined`` is the engine as it is (chunk k steps while
chunk k+1 comes down and chunk k-1 goes up), ``serial`` waits for every copy as soon as it is
issued (what a step without the pipeline costs: all copies plus all steps). Reported: the
median time of ``engine.step()`` (the optimizer step with its copies) per arm, and the
lower bound ``max(copies, step)`` the pipeline can reach.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zerorun.engine.offload import copy_checks  # noqa: E402
from zerorun.engine.offload.copies import Transfers  # noqa: E402


class DelayedStream:
    """One copy engine: copies run in issue order on a thread, each after bytes / bandwidth."""

    def __init__(self, gbps: float) -> None:
        self.gbps = gbps
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="copy-engine")
        self.last: Future[None] | None = None
        self.copied_s = 0.0
        self.serial = False
        self.pinned: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def run(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        delay = src.numel() * src.element_size() / (self.gbps * 1e9)
        self.copied_s += delay
        time.sleep(delay)
        with torch.no_grad():  # grad mode is per thread: this one's is on
            dst.copy_(src)


class Event:
    def __init__(self, stream: DelayedStream) -> None:
        self.stream = stream
        self.future: Future[None] | None = None

    def record(self) -> None:
        self.future = self.stream.last

    def synchronize(self) -> None:
        if self.future is not None:
            self.future.result()


class Cuda:
    def __init__(self, stream: DelayedStream) -> None:
        self.stream = stream

    def is_available(self) -> bool:
        return True

    def Event(self) -> Event:  # noqa: N802 - torch.cuda's name
        return Event(self.stream)


class DelayedTransfers(Transfers):
    def __init__(self, stream: DelayedStream) -> None:
        super().__init__(True, Cuda(stream))
        self.stream = stream

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        self.stream.pinned[t.untyped_storage().data_ptr()] = t
        return t

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        return self._keep(t.clone())

    def _pinned_empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return self._keep(torch.empty(shape, dtype=dtype))

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.stream.pinned

    def on_host(self, t: torch.Tensor) -> bool:
        return self.is_pinned(t)

    def _issue(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.stream.last = self.stream.pool.submit(self.stream.run, dst, src.clone() if self.on_host(dst) else src)
        if self.stream.serial:
            self.stream.last.result()


def model(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--gbps", type=float, default=2.0, help="the stand-in link's bandwidth, GB/s")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import zerorun

    torch.set_num_threads(args.threads)
    stream = DelayedStream(args.gbps)
    copy_checks.transfers = lambda pin_memory: DelayedTransfers(stream)  # what OffloadPolicy.transfers() returns
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**9,
           "zero_optimization": {"stage": 2, "reduce_bucket_size": args.width * args.width,
                                 "offload_optimizer": {"device": "cpu", "pin_memory": True}},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    engine, _, _, _ = zerorun.initialize(model=model(args.width, args.layers), config=cfg)
    x = torch.randn(8, args.width)
    times: dict[str, list[float]] = {"pipelined": [], "serial": []}
    copies: dict[str, list[float]] = {"pipelined": [], "serial": []}
    for step in range(2 * args.steps + 2):
        arm = "serial" if step % 2 else "pipelined"
        stream.serial = arm == "serial"
        engine.backward(engine(x).square().mean())
        stream.copied_s = 0.0
        t0 = time.perf_counter()
        engine.step()
        engine.parts.masters.copies.wait()  # the uploads too: the next forward reads them
        if step >= 2:
            times[arm].append(time.perf_counter() - t0)
            copies[arm].append(stream.copied_s)
    chunks = len(engine.parts.masters.step_chunks())
    numel = engine.num_parameters()
    print(f"{numel:,} fp32 parameters in {chunks} chunks, stand-in link {args.gbps:g} GB/s, "
          f"{args.threads} thread(s), median of {args.steps} steps per arm (alternated):")
    print("| arm | engine.step() ms | copies ms (injected) |\n|---|---:|---:|")
    for arm in times:
        print(f"| {arm} | {1000 * statistics.median(times[arm]):.0f} | {1000 * statistics.median(copies[arm]):.0f} |")
    serial, piped = statistics.median(times["serial"]), statistics.median(times["pipelined"])
    copy = statistics.median(copies["serial"])
    print(f"host work alone (serial minus copies): {1000 * (serial - copy):.0f} ms; the pipeline's floor "
          f"max(copies, host work) = {1000 * max(copy, serial - copy):.0f} ms; pipelined / serial = {piped / serial:.2f}")


if __name__ == "__main__":
    main()
