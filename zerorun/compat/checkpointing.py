"""``deepspeed.checkpointing``: DeepSpeed's activation-checkpointing API over ``torch.utils.checkpoint``.

``checkpoint(function, *args)`` runs ``function`` without keeping its activations and
recomputes them in backward, with the CPU (and CUDA) RNG state and the tracker's states
of the forward restored for the recomputation, so dropout draws the same masks.

It is torch's non-reentrant checkpoint: gradients reach the parameters inside even when
no input requires grad (DeepSpeed's reentrant function silently drops them then).
``cpu_checkpointing`` (``checkpoint_in_cpu``) keeps the checkpointed inputs (all that a
checkpoint holds) in host memory between forward and backward. Partitioning activations
across model-parallel ranks needs model parallelism, which zerorun does not have: with a
model-parallel group larger than one it is a named error; with none it is a no-op, as in
DeepSpeed. ``contiguous_memory_optimization``, ``number_checkpoints``,
``synchronize_checkpoint_boundary`` and ``profile`` only shape DeepSpeed's buffers and
timers; they are accepted and change nothing.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint

from zerorun.errors import unsupported

_MODEL_PARALLEL_RNG = "model-parallel-rng"


@dataclass
class Settings:
    """What ``configure`` set (DeepSpeed keeps these as module globals; so does its API)."""

    configured: bool = False
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False
    mpu: Any = None


SETTINGS = Settings()


def _rng_state() -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1])


class CudaRNGStatesTracker:
    """Named RNG states (DeepSpeed's/Megatron's tracker): ``fork(name)`` runs a block on that state."""

    def __init__(self) -> None:
        self.states_: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.seeds_: set[int] = set()

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, Any]:
        return copy.copy(self.states_)

    def set_states(self, states: dict[str, Any]) -> None:
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        before = _rng_state()
        torch.manual_seed(seed)
        self.states_[name] = _rng_state()
        _set_rng_state(before)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> Iterator[None]:
        if name not in self.states_:
            raise ValueError(f"rng state {name} is not added")
        before = _rng_state()
        _set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _rng_state()
            _set_rng_state(before)


_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _TRACKER


def _mp_world_size(mpu: Any) -> int:
    if mpu is None:
        return 1
    for name in ("get_tensor_model_parallel_world_size", "get_model_parallel_world_size"):
        if hasattr(mpu, name):
            return int(getattr(mpu, name)())
    return 1


def _mp_rank(mpu: Any) -> int:
    if mpu is None:
        return 0
    for name in ("get_tensor_model_parallel_rank", "get_model_parallel_rank"):
        if hasattr(mpu, name):
            return int(getattr(mpu, name)())
    return 0


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """DeepSpeed's seeding: the default generator gets ``seed``; the tracker's model-parallel state
    ``seed + 2718 + tensor-parallel rank``."""
    _TRACKER.reset()
    torch.manual_seed(seed)
    _TRACKER.add(_MODEL_PARALLEL_RNG, seed + 2718 + _mp_rank(SETTINGS.mpu))


def _from_config(deepspeed_config: Any) -> dict[str, Any]:
    from zerorun.config import load_config

    block = load_config(deepspeed_config).activation_checkpointing
    return block.model_dump()


def configure(mpu_: Any, deepspeed_config: Any = None, partition_activations: bool | None = None,
              contiguous_checkpointing: bool | None = None, num_checkpoints: int | None = None,
              checkpoint_in_cpu: bool | None = None, synchronize: bool | None = None,
              profile: bool | None = None) -> None:
    """Configure from the config's ``activation_checkpointing`` block, then the explicit arguments."""
    global SETTINGS
    settings = Settings(configured=True, mpu=mpu_)
    if deepspeed_config is not None:
        for key, value in _from_config(deepspeed_config).items():
            setattr(settings, key, value)
    explicit = {"partition_activations": partition_activations,
                "contiguous_memory_optimization": contiguous_checkpointing, "number_checkpoints": num_checkpoints,
                "cpu_checkpointing": checkpoint_in_cpu, "synchronize_checkpoint_boundary": synchronize,
                "profile": profile}
    for key, value in explicit.items():
        if value is not None:
            setattr(settings, key, value)
    if settings.partition_activations and _mp_world_size(mpu_) > 1:
        unsupported("activation partitioning across model-parallel ranks (activation_checkpointing."
                    "partition_activations with a model-parallel group)",
                    "zerorun has no model parallelism: set partition_activations to false")
    SETTINGS = settings


def is_configured() -> bool:
    return SETTINGS.configured


def reset() -> None:
    """DeepSpeed frees its contiguous buffers here; zerorun keeps none."""


def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    SETTINGS.partition_activations = partition_activation


def set_num_layers(nlayers: int) -> None:
    SETTINGS.number_checkpoints = nlayers


def _tracker_restoring_contexts() -> tuple[Any, Any]:
    """The recomputation runs on the tracker states the forward started from (as DeepSpeed's does)."""
    saved = {k: v for k, v in _TRACKER.get_states().items()}

    @contextlib.contextmanager
    def recompute() -> Iterator[None]:
        current = _TRACKER.get_states()
        _TRACKER.set_states(dict(saved))
        try:
            yield
        finally:
            _TRACKER.set_states(current)

    return contextlib.nullcontext(), recompute()


def _on_host(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[torch.device | None]]:
    devices = [a.device if torch.is_tensor(a) else None for a in args]
    return tuple(a.to("cpu") if torch.is_tensor(a) else a for a in args), devices


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, its activations recomputed in backward instead of kept."""
    run = function
    if SETTINGS.cpu_checkpointing:  # what the checkpoint holds (its inputs) waits in host memory
        args, devices = _on_host(args)

        def run(*host_args: Any, **kw: Any) -> Any:
            back = (a.to(d) if d is not None else a for a, d in zip(host_args, devices, strict=True))
            return function(*back, **kw)

    return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, preserve_rng_state=True,
                                             context_fn=_tracker_restoring_contexts, **kwargs)


def non_reentrant_checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    return checkpoint(function, *args)


__all__ = ["CudaRNGStatesTracker", "checkpoint", "configure", "get_cuda_rng_tracker", "is_configured",
           "model_parallel_cuda_manual_seed", "non_reentrant_checkpoint", "partition_activations_in_checkpoint",
           "reset", "set_num_layers"]
