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

from tests.child_output import own_words
from zerorun.engine.comm.bootstrap import (
    choose_device_type,
    cuda_index,
    device_backends,
    init_device,
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
from zerorun.engine.comm.bootstrap import init_distributed
from zerorun.engine.comm.collectives import Collectives
dist.init_process_group("cpu:gloo", store=dist.HashStore(), rank=0, world_size=1)
ctx = init_distributed()  # reuses the group
coll = Collectives(ctx.group, 1, 0)
print(ctx.device, ctx.backend, coll.device, coll.native_reduce_scatter)
"""


def test_a_cpu_gloo_group_gives_cpu_and_emulated_scatter() -> None:
    """In a fresh interpreter: this one may hold a default group from another test."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, "-c", CPU_GLOO], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[3], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert own_words(proc.stdout) == ["cpu", "gloo", "cpu", "False"]


def test_the_cuda_device_is_the_local_rank_or_the_only_visible_one() -> None:
    assert [cuda_index(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert cuda_index(3, 1) == 0  # one GPU bound to this process
    with pytest.raises(EngineError, match="sees 2 CUDA device"):
        cuda_index(2, 2)


@pytest.mark.parametrize(("backend", "cuda", "device"), [
    ("nccl", True, "cuda:1"), ("cpu:gloo,cuda:nccl", True, "cuda:1"), ("gloo", True, None),
    ("cpu:gloo,cuda:gloo", True, None), ("nccl", False, None),
])
def test_the_gpu_is_chosen_for_init_only_on_gpu_backends(backend: str, cuda: bool, device: str | None) -> None:
    chosen = init_device(backend, 1, cuda, 4)
    assert (str(chosen) if chosen is not None else None) == device


def test_the_device_is_set_before_the_group_and_passed_as_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU exists here: torch.cuda and init_process_group are replaced by recorders of the call order."""
    import torch
    import torch.distributed as dist

    from zerorun.engine.comm import bootstrap

    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append(("init", str(k.get("device_id")))))
    monkeypatch.setattr(bootstrap, "_context", lambda local_rank: local_rank)
    monkeypatch.setattr(bootstrap, "atexit", type("A", (), {"register": staticmethod(lambda f: None)}))
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                       "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    assert bootstrap.init_distributed("nccl") == 1
    assert calls == [("set_device", "cuda:1"), ("init", "cuda:1")]
