"""Process-group bootstrap from the launcher's environment (also torchrun's).

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` name the job.
NCCL when CUDA is available, gloo otherwise.

The compute device is read from the group's device->backend map
(``dist.get_backend_config``: ``"cuda:nccl"``, ``"cpu:gloo,cuda:nccl"``, ``"cpu:gloo"``),
never from the backend's name alone: ``init_process_group()`` with no backend on a GPU
machine reports ``get_backend() == "undefined"``, and a mixed group reports both, yet
both serve CUDA with NCCL. With no ``WORLD_SIZE`` in the environment a
plain ``python train.py`` is a world of one (an in-memory store, no network). A default
process group the script already created is reused, never re-created.
"""

from __future__ import annotations

import atexit
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from zerorun import simulate
from zerorun.engine.errors import EngineError

_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # the backend serving ``device`` (e.g. "nccl" for "cpu:gloo,cuda:nccl" on a GPU)
    device: torch.device
    group: dist.ProcessGroup | None


# backends with their own reduce-scatter and all-gather-into-tensor (gloo emulates them); torch's
# fake group (zerorun.simulate) has them too, and its point-to-point does nothing
NATIVE_SCATTER_BACKENDS = frozenset({"nccl", "ucc", "xccl", "fake"})


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device_backends(config: str) -> dict[str, str]:
    """Parse a backend config (``"cpu:gloo,cuda:nccl"``) into ``{device type: backend}``.

    A bare name (``"gloo"``) maps to ``cpu`` only: the group's own config string is
    always in ``device:backend`` form, so a bare name only comes from a caller's string.
    """
    out: dict[str, str] = {}
    for pair in config.lower().replace(" ", "").split(","):
        if not pair:
            continue
        device, sep, backend = pair.partition(":")
        out[device if sep else "cpu"] = backend if sep else device
    return out


def choose_device_type(backends: dict[str, str], cuda_available: bool) -> str:
    """The compute device type for a group serving ``backends``.

    CUDA when it is present and served by a GPU backend (NCCL & co.; gloo's CUDA support
    is a slow fallback, so ``gloo`` alone keeps the CPU), else the CPU when the group
    serves it, else CUDA through whatever serves it.
    """
    cuda = backends.get("cuda")
    if cuda_available and cuda is not None and cuda != "gloo":
        return "cuda"
    if "cpu" in backends:
        return "cpu"
    if cuda is not None and cuda_available:
        return "cuda"
    raise EngineError(f"the process group serves {backends or 'no device'}, none of which this process can use",
                      "initialize torch.distributed with gloo (CPU) or, on a GPU machine, nccl")


def serving(backends: dict[str, str], cuda_available: bool) -> tuple[str, str]:
    """The device type a group serving ``backends`` computes on, and the backend serving it.

    A simulated world (torch's fake group, :mod:`zerorun.simulate`) computes on the
    simulation's device, the CPU or ``meta``, never on a GPU the machine may have.
    """
    if simulate.is_fake(backends):
        return simulate.device_type(), simulate.FAKE_BACKEND
    device_type = choose_device_type(backends, cuda_available)
    return device_type, backends[device_type]


def group_backends(group: dist.ProcessGroup | None = None) -> dict[str, str]:
    """``{device type: backend}`` of ``group`` (default: the world group)."""
    return device_backends(dist.get_backend_config(group))


def native_scatter(backend: str) -> bool:
    """Whether ``backend`` has a native reduce-scatter / all-gather-into-tensor."""
    return backend in NATIVE_SCATTER_BACKENDS


def cuda_index(local_rank: int, visible: int) -> int:
    """The CUDA device of the rank: ``LOCAL_RANK`` among the visible devices, or the only one
    visible (a scheduler that binds one GPU to each process, e.g. ``srun --gpus-per-task=1``)."""
    if visible == 1:
        return 0
    if 0 <= local_rank < visible:
        return local_rank
    raise EngineError(f"LOCAL_RANK is {local_rank}, but this process sees {visible} CUDA device(s)",
                      "start at most one rank per visible GPU (check CUDA_VISIBLE_DEVICES and --num_gpus)")


def _device(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cuda":
        index = cuda_index(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(device_type)


def _context(local_rank: int) -> DistContext:
    """The context of the (initialized) default group: its device and the backend serving it."""
    device_type, backend = serving(group_backends(), torch.cuda.is_available())
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, backend,
                       _device(device_type, local_rank), dist.group.WORLD)


def init_distributed(dist_backend: str | None = None, timeout: timedelta = timedelta(minutes=30),
                     init_method: str | None = None) -> DistContext:
    """Join (or reuse) the default process group and return this rank's :class:`DistContext`."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_initialized():
        return _context(local_rank)
    if (simulation := simulate.from_env()) is not None:  # ZERORUN_SIMULATE: this process plays one rank of N
        simulate.join(simulation)
        return _context(local_rank)
    backend = dist_backend or default_backend()
    if init_method is None and "WORLD_SIZE" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return _context(0)
    missing = [k for k in _REQUIRED if k not in os.environ]
    if init_method is None and missing:
        raise EngineError(f"WORLD_SIZE is set but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not",
                          "start the script with `zerorun --num_gpus N script.py` or torchrun, "
                          "which set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank")
    dist.init_process_group(backend, init_method=init_method or "env://", timeout=timeout)
    atexit.register(_destroy_at_exit)
    return _context(local_rank)


# gloo's worker thread frees each finished work itself, and freeing a work whose tensors Python
# created takes the GIL, which a finalizing interpreter never grants: the thread exits through a
# noexcept destructor and the rank aborts ("terminate called without an active exception"). A
# blocking collective returns when its work completes, before the worker frees it; on a busy
# machine the woken main thread can reach the end of the script first (1 run in 24 of a
# stage-3 checkpointing script). Exit waits this long, with the GIL released, for them.
EXIT_GRACE_S = 0.1


def _destroy_at_exit() -> None:
    # The group this module created is shut down before the interpreter tears down: left to
    # interpreter teardown, gloo's threads can meet a peer that already exited and abort
    # the rank (seen ~1 run in 6 at stage 3).
    if dist.is_initialized():
        dist.destroy_process_group()
        time.sleep(EXIT_GRACE_S)
