"""Process-group bootstrap from the launcher's environment (also torchrun's).

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` name the job
(or srun's / mpirun's own variables, :mod:`zerorun.engine.comm.scheduler_env`). NCCL when CUDA
is available, gloo otherwise; the GPU is bound before the group is created.

The compute device is read from the group's device->backend map
(``dist.get_backend_config``: ``"cuda:nccl"``, ``"cpu:gloo,cuda:nccl"``, ``"cpu:gloo"``),
never from the backend's name alone: ``init_process_group()`` with no backend on a GPU
machine reports ``get_backend() == "undefined"``, and a mixed group reports both, yet
both serve CUDA with NCCL. With no launcher's variables in the environment a
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

from zerorun import heartbeat, simulate
from zerorun.engine.comm.scheduler_env import job_env
from zerorun.engine.errors import EngineError


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
                     init_method: str | None = None, rank: int = -1, world_size: int = -1) -> DistContext:
    """Join (or reuse) the default process group and return this rank's :class:`DistContext`.

    The job is read by :func:`~zerorun.engine.comm.scheduler_env.job_env` (zerorun, torchrun,
    srun, mpirun); with none of their variables the process is a world of one. An explicit
    ``init_method`` with ``rank``/``world_size`` (DeepSpeed's ``init_distributed`` arguments,
    e.g. a ``file://`` rendezvous) is passed to torch as given.
    """
    heartbeat.start()  # the launcher's agent hears from this rank from here on (zerorun.heartbeat)
    if dist.is_initialized():
        return _context(int(os.environ.get("LOCAL_RANK", "0")))
    if (simulation := simulate.from_env()) is not None:  # ZERORUN_SIMULATE: this process plays one rank of N
        simulate.join(simulation)
        return _context(int(os.environ.get("LOCAL_RANK", "0")))
    backend = dist_backend or default_backend()
    job = job_env(os.environ) if init_method is None else None
    if init_method is None and (job is None or job.world_size == 1):
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                **_device_id_kwargs(backend, job.local_rank if job else 0))
        _OWN_GROUP.add(os.getpid())
        return _context(job.local_rank if job else 0)
    if job is not None:
        os.environ.update(job.torch_env())  # env:// reads these; srun/mpirun set only their own
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    given = {"rank": rank, "world_size": world_size} if init_method is not None and rank >= 0 else {}
    dist.init_process_group(backend, init_method=init_method or "env://", timeout=timeout, **given,
                            **_device_id_kwargs(backend, local_rank))
    _OWN_GROUP.add(os.getpid())
    atexit.register(destroy_group)
    heartbeat.channel.exiting()  # runs before the line above at exit: the launcher hears "exiting" first
    return _context(local_rank)


def serves_cuda(backend: str) -> bool:
    """Whether a group created with ``backend`` runs its CUDA collectives on a GPU backend."""
    return backend in NATIVE_SCATTER_BACKENDS or device_backends(backend).get("cuda") not in (None, "gloo")


def init_device(backend: str, local_rank: int, cuda_available: bool, visible: int) -> torch.device | None:
    """The rank's GPU, bound before ``init_process_group`` (None on CPU backends).

    NCCL creates its communicator on the current device: set after init, the first
    collective of every rank would build one on ``cuda:0``. ``device_id`` also lets torch
    create the communicator eagerly, so a bad topology fails at init, not at step 1.
    """
    if not (cuda_available and serves_cuda(backend)):
        return None
    return torch.device("cuda", cuda_index(local_rank, visible))


def _device_id_kwargs(backend: str, local_rank: int) -> dict[str, torch.device]:
    available = torch.cuda.is_available()
    device = init_device(backend, local_rank, available, torch.cuda.device_count() if available else 0)
    if device is None:
        return {}
    torch.cuda.set_device(device)
    return {"device_id": device}


# gloo's worker thread frees each finished work itself, and freeing a work whose tensors Python
# created takes the GIL, which a finalizing interpreter never grants: the thread exits through a
# noexcept destructor and the rank aborts ("terminate called without an active exception"). A
# blocking collective returns when its work completes, before the worker frees it; on a busy
# machine the woken main thread can reach the end of the script first (1 run in 24 of a
# stage-3 checkpointing script). Exit waits this long, with the GIL released, for them.
EXIT_GRACE_S = 0.1


_OWN_GROUP: set[int] = set()  # the pids in which init_distributed created the default group


def owns_group() -> bool:
    """Whether the default group is one :func:`init_distributed` created (in this process), not the script."""
    return os.getpid() in _OWN_GROUP and dist.is_initialized()


def destroy_group() -> None:
    """The default group shut down, then the exit grace (at exit, and at a trial's end).

    Left to interpreter teardown, gloo's threads can meet a peer that already exited and
    abort the rank (seen ~1 run in 6 at stage 3; a finished autotune trial 1 run in 2).
    """
    if dist.is_initialized():
        dist.destroy_process_group()
        time.sleep(EXIT_GRACE_S)
