"""The compute device and the collective kinds come from the group's device->backend map.

A GPU machine cannot be had here, so the CUDA cases run the pure functions over the
backend strings torch reports (``dist.get_backend_config``), with ``cuda_available`` as
an argument; the CPU case uses a real gloo group created as "cpu:gloo".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerorun.engine.bootstrap import (
    choose_device_type,
    cuda_index,
    device_backends,
    native_scatter,
)
from zerorun.engine.errors import EngineError


@pytest.mark.parametrize(("config", "cuda", "device", "backend"), [
    ("cuda:nccl", True, "cuda", "nccl"),                 # init_process_group() on a GPU machine
    ("cpu:gloo,cuda:nccl", True, "cuda", "nccl"),        # the mixed group
    ("cpu:gloo, cuda:nccl", True, "cuda", "nccl"),
    ("cpu:gloo,cuda:nccl", False, "cpu", "gloo"),
    ("cpu:gloo,cuda:gloo", True, "cpu", "gloo"),         # init_process_group("gloo"): stays on the CPU
    ("cpu:gloo", True, "cpu", "gloo"),
    ("gloo", False, "cpu", "gloo"),
    ("nccl", True, "cpu", "nccl"),                       # a bare name is read as the CPU's
])
def test_device_and_backend_from_the_map(config: str, cuda: bool, device: str, backend: str) -> None:
    backends = device_backends(config)
    chosen = choose_device_type(backends, cuda)
    assert (chosen, backends[chosen]) == (device, backend)


def test_native_scatter_only_where_the_backend_has_it() -> None:
    assert native_scatter("nccl") and not native_scatter("gloo") and not native_scatter("undefined")


def test_a_cuda_only_group_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(EngineError, match="serves"):
        choose_device_type(device_backends("cuda:nccl"), False)


CPU_GLOO = """
import torch, torch.distributed as dist
from zerorun.engine.bootstrap import init_distributed
from zerorun.engine.collectives import Collectives
dist.init_process_group("cpu:gloo", store=dist.HashStore(), rank=0, world_size=1)
ctx = init_distributed()  # reuses the group
coll = Collectives(ctx.group, 1, 0)
print(ctx.device, ctx.backend, coll.device, coll.native_reduce_scatter)
"""


def test_a_cpu_gloo_group_gives_cpu_and_emulated_scatter() -> None:
    """In a fresh interpreter: this one may hold a default group from another test."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, "-c", CPU_GLOO], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "gloo", "cpu", "False"]


def test_the_cuda_device_is_the_local_rank_or_the_only_visible_one() -> None:
    assert [cuda_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert cuda_index(3, 1) == 0  # one GPU bound to this process
    with pytest.raises(EngineError, match="sees 2 CUDA device"):
        cuda_index(2, 2)
