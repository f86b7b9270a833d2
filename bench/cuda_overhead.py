"""What the device memory outside torch's allocator is made of: the estimate's fixed overhead, measured.

``zerorun estimate`` adds a fixed per-GPU overhead (``DEFAULT_OVERHEAD``: CUDA context, NCCL's
buffers, allocator slack) that no model term covers. This probe, run in a fresh process on one
GPU, reads ``total - free`` from the driver less ``torch.cuda.memory_reserved`` after each thing
a training process sets up, in the order a rank does::

    python bench/cuda_overhead.py            # one GPU; one JSON line, then a table

It cannot show NCCL's buffers at world > 1 (they grow with the peers and channels a
communicator opens); at world 1 NCCL opens none, so its row is the communicator alone.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zerorun.estimate.memory_model import DEFAULT_OVERHEAD  # noqa: E402


def outside_allocator(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) - torch.cuda.memory_reserved(device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps(device: torch.device) -> list[tuple[str, Callable[[], object]]]:
    a = torch.randn(2048, 2048, device=device)
    x = torch.ones(1 << 20, device=device)

    def nccl() -> None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)

    def collectives() -> None:
        dist.all_reduce(x)
        out = torch.empty_like(x)
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_tensor(x, out)

    return [("cuBLAS fp32 matmul", lambda: a @ a), ("cuBLAS bf16 matmul", lambda: a.bfloat16() @ a.bfloat16()),
            ("NCCL communicator (world 1)", nccl), ("NCCL all_reduce, all_gather, reduce_scatter", collectives)]


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_overhead: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.init()
    torch.empty(1, device=device)  # the context exists from here
    rows = [("CUDA context", outside_allocator(device))]
    for name, step in steps(device):
        step()
        rows.append((name, outside_allocator(device)))
    if dist.is_initialized():
        dist.destroy_process_group()
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(device),
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                      "estimate_overhead": DEFAULT_OVERHEAD, "outside_allocator": dict(rows)}))
    print(f"{'after':<48} {'outside the allocator':>22}")
    for name, used in rows:
        print(f"{name:<48} {used / 2**20:>18.0f} MiB")
    print(f"{'the estimate adds':<48} {DEFAULT_OVERHEAD / 2**20:>18.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
