"""A simulated world: one process runs the real engine as rank ``r`` of ``N``, on torch's fake process group.

Imported as :mod:`zerorun.simulate`, which re-exports this module's names.

    with zerorun.simulate.world(512, rank=7, device="meta"):
        engine, *_ = zerorun.initialize(model=model, config="ds.json")   # rank 7 of 512
    ZERORUN_SIMULATE=512 ZERORUN_SIMULATE_RANK=7 python train.py          # a script, unchanged

``init_distributed`` (so ``zerorun.initialize`` and ``zero.Init``) joins the fake group
when ``ZERORUN_SIMULATE`` names a world size; :func:`world` sets those variables and
joins it for a ``with``. The fake group keeps every collective's shapes and byte counts
but not its values: an all-gather repeats the local shard, a reduction does not sum,
point-to-point does nothing. The engine computes on ``ZERORUN_SIMULATE_DEVICE``: the CPU
(real allocations, so real peaks) or ``meta`` (no storage at all: any size runs in
seconds and a few hundred MB).

What it guarantees: the engine's own code path at (r, N) - layout, padding, shard
ranges, the bytes each rank holds, the sequence and size of every collective, the
gather decisions, and on the CPU the real allocation peaks. What it cannot show:
numerics (losses are meaningless, the global norm is not computed), agreement between
ranks, deadlocks, timing, NCCL's buffers or the CUDA caching allocator.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch.distributed as dist

from zerorun.errors import ZerorunError

WORLD_ENV = "ZERORUN_SIMULATE"
RANK_ENV = "ZERORUN_SIMULATE_RANK"
DEVICE_ENV = "ZERORUN_SIMULATE_DEVICE"
DEVICES = ("cpu", "meta")
FAKE_BACKEND = "fake"

Device = Literal["cpu", "meta"]


class SimulationError(ZerorunError):
    """A simulated world that cannot be set up as asked."""


@dataclass(frozen=True)
class Simulation:
    """This process plays ``rank`` of ``world_size`` ranks and computes on ``device``."""

    world_size: int
    rank: int = 0
    device: Device = "cpu"

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise SimulationError(f"a simulated world needs at least 1 rank, not {self.world_size}",
                                  f"set {WORLD_ENV} (or --world) to the number of ranks, e.g. 512")
        if not 0 <= self.rank < self.world_size:
            raise SimulationError(f"rank {self.rank} is not in a world of {self.world_size}",
                                  f"pick a rank from 0 to {self.world_size - 1} ({RANK_ENV} or --rank)")
        if self.device not in DEVICES:
            raise SimulationError(f"{DEVICE_ENV}={self.device!r} is not a simulation device",
                                  "use cpu (real allocations) or meta (no storage)")

    def environ(self) -> dict[str, str]:
        return {WORLD_ENV: str(self.world_size), RANK_ENV: str(self.rank), DEVICE_ENV: self.device}


def _int_env(environ: Mapping[str, str], name: str, default: str) -> int:
    raw = environ.get(name, default).strip()
    try:
        return int(raw)
    except ValueError:
        raise SimulationError(f"{name}={raw!r} is not a whole number",
                              f"set {name} to an integer, e.g. {name}={default if default != '0' else '7'}") from None


def from_env(environ: Mapping[str, str] | None = None) -> Simulation | None:
    """The simulation ``ZERORUN_SIMULATE*`` describe, or None when ``ZERORUN_SIMULATE`` is unset or empty."""
    environ = os.environ if environ is None else environ
    if not environ.get(WORLD_ENV, "").strip():
        return None
    device = environ.get(DEVICE_ENV, "cpu").strip().lower() or "cpu"
    return Simulation(_int_env(environ, WORLD_ENV, "512"), _int_env(environ, RANK_ENV, "0"), device)  # type: ignore[arg-type]


def is_fake(backends: Mapping[str, str]) -> bool:
    """Whether a group's ``{device type: backend}`` map is torch's fake process group."""
    return bool(backends) and set(backends.values()) == {FAKE_BACKEND}


def device_type() -> str:
    """The device a simulated engine computes on (``ZERORUN_SIMULATE_DEVICE``, default the CPU)."""
    sim = from_env()
    return sim.device if sim is not None else "cpu"


def join(sim: Simulation) -> None:
    """Create the default process group as torch's fake group of ``sim.world_size`` ranks."""
    from zerorun import torch_compat  # its import registers the "fake" backend

    dist.init_process_group(FAKE_BACKEND, rank=sim.rank, world_size=sim.world_size, store=torch_compat.fake_store())


@contextlib.contextmanager
def world(world_size: int, rank: int = 0, device: Device = "cpu") -> Iterator[Simulation]:
    """Inside the ``with``, this process is ``rank`` of ``world_size`` (a fake default group).

    The ``ZERORUN_SIMULATE*`` variables are set for the body (a script it runs sees the
    same world) and restored after; the group is destroyed on exit. A default group
    that already exists is an error: one process holds one world.
    """
    sim = Simulation(world_size, rank, device)
    if dist.is_initialized():
        raise SimulationError("a process group already exists in this process",
                              "enter zerorun.simulate.world() before anything initializes torch.distributed")
    saved = {k: os.environ.get(k) for k in sim.environ()}
    os.environ.update(sim.environ())
    try:
        join(sim)
        yield sim
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
