"""DeepSpeed's smaller engine accessors, mixed into :class:`zerorun.engine.engine.Engine`.

Real scripts call these (``engine.zero_optimization_stage()``, ``engine.global_rank``,
``engine.no_sync()``, ...); they read the engine's own state and add no mechanism.
Unknown attributes are forwarded to the wrapped module, as DeepSpeed's engine does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.errors import CoalesceUnsupported, NoSyncMisuse, rank_prefixed
from zerorun.engine.surface.tput_timer import TputTimer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zerorun.engine.surface.offload_states import OffloadDeviceEnum, OffloadStateTypeEnum, StateMover


class DeepSpeedSurface:
    """Accessors over ``self.ctx``, ``self.config``, ``self.stage``, ``self.module``, ``self.parts``."""

    _no_sync = False
    _boundary_override: bool | None = None
    pipeline_parallelism: bool = False
    """DeepSpeed's flag for a ``PipelineEngine``; zerorun has none (``deepspeed.pipe`` is refused), so False."""

    # ---- where this rank sits ------------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def dp_world_size(self) -> int:
        return self.ctx.world_size  # the engine is data-parallel only

    @property
    def mp_world_size(self) -> int:
        return 1

    def get_data_parallel_rank(self) -> int:
        return self.ctx.rank

    def get_data_parallel_world_size(self) -> int:
        return self.ctx.world_size

    def get_model_parallel_rank(self) -> int:
        return 0

    # ---- what the config says ------------------------------------------------------------------
    def zero_optimization_stage(self) -> int:
        return int(self.stage.stage)

    def zero_optimization(self) -> bool:
        return self.zero_optimization_stage() > 0

    def zero_optimization_partition_gradients(self) -> bool:
        return self.zero_optimization_stage() >= 2

    def fp16_enabled(self) -> bool:
        return bool(self.config.fp16.enabled)

    def bfloat16_enabled(self) -> bool:
        return bool(self.config.bf16.enabled)

    def gradient_clipping(self) -> float:
        return float(self.config.gradient_clipping)

    def steps_per_print(self) -> int:
        return int(self.config.steps_per_print)

    def wall_clock_breakdown(self) -> bool:
        return bool(self.config.wall_clock_breakdown)

    # ---- step state ----------------------------------------------------------------------------
    def was_step_applied(self) -> bool:
        """True if the last ``step()`` call took an optimizer step (a boundary, and no overflow skip)."""
        if self._boundary_override is not None:
            boundary = self._boundary_override
        else:  # step() counts the micro-step after deciding, so a boundary step leaves a multiple of gas
            boundary = self.micro_steps > 0 and self.micro_steps % self.gradient_accumulation_steps() == 0
        return boundary and self._grad_norm is not None  # an overflow skip leaves no gradient norm

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether this micro-step ends the accumulation: from the step count, unless the script set it.

        Inside :meth:`no_sync` it is False, so ``backward`` keeps the gradients local.
        """
        if self._no_sync:
            return False
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Override the count-based boundary (DeepSpeed's pipeline/HF-accelerate hook)."""
        self._boundary_override = bool(is_boundary)

    @property
    def _is_gradient_accumulation_boundary(self) -> bool | None:
        """DeepSpeed's attribute: the boundary the script set, None where the step count decides."""
        return self._boundary_override

    @_is_gradient_accumulation_boundary.setter
    def _is_gradient_accumulation_boundary(self, value: bool | None) -> None:
        self._boundary_override = None if value is None else bool(value)

    def _get_optimizer_ckpt_name(self, checkpoints_path: str, tag: str, expp_rank: int = 0) -> str:
        """DeepSpeed's name of an expert-parallel rank's optimizer file in a tag folder. zerorun writes none (no
        expert parallelism; a rank's optimizer state is in its ``rank_NNNNN.pt``) and never reads one; the
        name is given for scripts and tests that look it up or wrap it."""
        return os.path.join(checkpoints_path, str(tag), f"expp_rank_{expp_rank}_mp_rank_00_optim_states.pt")

    def _change_recovery_script_permissions(self, dst: str) -> None:
        """Make the ``zero_to_fp32.py`` a checkpoint carries executable, as ``save_checkpoint`` does; a file
        system that refuses chmod is logged at INFO on DeepSpeed's logger, never raised (DeepSpeed's rule)."""
        from zerorun.engine.checkpoint.save import make_executable

        make_executable(Path(dst))

    def allreduce_gradients(self, bucket_size: int | None = None) -> None:
        """Reduce the gradients the backward passes since the last reduction kept local (DeepSpeed's public
        reduction). Each boundary ``backward`` has reduced already, so after one this does nothing; after passes
        that kept theirs local (``no_sync()``, a non-boundary micro-step at stages 0-1) it reduces their sum now,
        as the boundary pass would have. ``bucket_size`` is DeepSpeed's and ignored: the buckets are the layout's.
        Every rank must call it (a collective, as in DeepSpeed)."""
        sync = self.parts.grad_sync
        sync.unwind_aborted()
        if sync.window_passes and not sync.sync:
            sync.reduce_held()

    def _backward_epilogue(self) -> None:
        """DeepSpeed's end of a backward, which scripts call after one plain ``loss.backward()`` over several
        engines' modules (a shared loss): each engine's reducer ended its pass when autograd finished it,
        so only a pass that raised is left to unwind."""
        self.parts.grad_sync.unwind_aborted()

    @contextlib.contextmanager
    def coalesce_grad_reduction(self) -> Iterator[None]:
        """One with-block is one optimizer step's backward passes: each ``backward`` inside keeps its
        gradients local, and the exit reduces what they summed, once (DeepSpeed 0.19.8's context).

        ``step()`` inside raises, as does nesting with :meth:`no_sync` either way; stage 0 raises
        ``NotImplementedError``, as in DeepSpeed. The boundary the script set (``_is_gradient_accumulation_boundary``)
        is what it was at entry again after the exit. Stages 2-3 hold no full gradients: their passes
        reduce-scatter into the gradient shard as accumulation does, and the exit only completes the step's
        sum (the result is the same; see docs/compat.md)."""
        if self.zero_optimization_stage() == 0:
            raise CoalesceUnsupported(rank_prefixed(self.ctx.rank, "coalesce_grad_reduction requires ZeRO stage "
                                                    f"1/2/3, got stage {self.zero_optimization_stage()}"),
                                      "use no_sync() at stage 0")
        if self.pipeline_parallelism:
            raise CoalesceUnsupported(rank_prefixed(self.ctx.rank, "coalesce_grad_reduction is not supported "
                                                    "under pipeline parallelism"))
        if self._no_sync:
            raise NoSyncMisuse(rank_prefixed(self.ctx.rank, "coalesce_grad_reduction cannot be nested inside "
                                             "another no_sync context"),
                               "leave no_sync() (or the outer coalesce_grad_reduction()) first")
        saved = self._boundary_override
        self._no_sync = True  # as DeepSpeed's shared flag: backward keeps gradients local, step() and no_sync() raise
        try:
            yield
        finally:
            self._no_sync = False
            sync = self.parts.grad_sync
            sync.unwind_aborted()  # a backward that raised inside adds nothing
            sync.reduce_held()
            self._boundary_override = saved

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients of the ``backward`` calls inside accumulate locally, with no communication.

        The next ``backward`` outside on an accumulation boundary reduces the sum, as DDP's
        ``no_sync``. Stages 2 and 3 partition gradients during backward, so, as in DeepSpeed,
        they cannot.
        """
        if self.zero_optimization_partition_gradients():
            raise NoSyncMisuse(rank_prefixed(self.ctx.rank, "no_sync context manager is incompatible with gradient "
                                             f"partitioning logic of ZeRO stage {self.zero_optimization_stage()}: "
                                             "it reduce-scatters gradients during every backward"),
                              "use stage 0 or 1 for no_sync(), or accumulate with gradient_accumulation_steps")
        if self._no_sync:
            raise NoSyncMisuse(rank_prefixed(self.ctx.rank, "no_sync context manager reentry is unsupported: "
                                             "no_sync() entered twice"),
                              "no_sync() contexts do not nest")
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False

    def _check_step_allowed(self) -> None:
        if self._no_sync:
            raise NoSyncMisuse(rank_prefixed(self.ctx.rank, "It is illegal to call Engine.step() inside no_sync "
                                             "context manager: engine.step() was called inside no_sync()"),
                              "leave the no_sync() block, run the last backward outside it, then step() "
                              "(as DeepSpeed requires)")

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """Change the global batch by changing the accumulation steps (the micro-batch stays), as DeepSpeed.

        Call it between optimizer steps: the new count applies from the next micro-step.
        """
        per_pass = int(self.config.train_micro_batch_size_per_gpu) * self.dp_world_size
        if train_batch_size <= 0 or train_batch_size % per_pass:
            raise ValueError(f"train batch size {train_batch_size} must be a positive multiple of "
                             f"train_micro_batch_size_per_gpu ({self.config.train_micro_batch_size_per_gpu}) x "
                             f"data-parallel world size ({self.dp_world_size}) = {per_pass}")
        self.config = self.config.model_copy(update={"train_batch_size": train_batch_size,
                                                     "gradient_accumulation_steps": train_batch_size // per_pass})
        self.throughput.samples_per_step = train_batch_size

    def empty_partition_cache(self) -> None:
        """Release the gathered stage-3 parameters that are not persistent (DeepSpeed's use: before
        generation or evaluation frees memory); other stages hold no partition cache."""
        coordinator = self.parts.coordinator
        if coordinator is not None:
            coordinator.release_all()  # persistent buckets stay, as the step's refresh expects

    def offload_states(self, include: Iterable[OffloadStateTypeEnum | str] | None = None,
                       device: OffloadDeviceEnum | str = "cpu", pin_memory: bool = True,
                       non_blocking: bool = False) -> None:
        """Move optimizer states, masters and parameters to host memory (see :mod:`zerorun.engine.surface.offload_states`)."""
        self._state_mover().offload(include, device, pin_memory, non_blocking)

    def reload_states(self, non_blocking: bool = False) -> None:
        """Bring back what :meth:`offload_states` moved, to where it was."""
        self._state_mover().reload(non_blocking)

    def _state_mover(self) -> StateMover:
        from zerorun.engine.surface.offload_states import StateMover

        if "_mover" not in self.__dict__:
            self.__dict__["_mover"] = StateMover(self)
        return self.__dict__["_mover"]

    def torch_autocast_enabled(self) -> bool:
        return bool(self.config.torch_autocast.enabled)

    def torch_autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.torch_autocast_enabled() else None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward's autocast, as DeepSpeed 0.19.8's ``autocast_if_enabled``: the config's
        ``torch_autocast`` when enabled; otherwise an autocast the caller opened is switched off
        inside the engine (the fp16/bf16 blocks decide the precision)."""
        device = self.ctx.device.type
        if device == "meta":  # simulation: nothing is computed, and autocast knows no meta device
            return contextlib.nullcontext()
        if self.torch_autocast_enabled():
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
        if torch.is_autocast_enabled(device):
            return torch.autocast(device_type=device, enabled=False)
        return contextlib.nullcontext()

    # ---- the module ----------------------------------------------------------------------------
    def module_state_dict(self, destination: dict[str, Any] | None = None, prefix: str = "",
                          keep_vars: bool = False, exclude_frozen_parameters: bool = False) -> dict[str, Any]:
        """The module's state dict (stage 3: this rank's placeholders; use ``save_16bit_model`` for full weights)."""
        sd = self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        if exclude_frozen_parameters:
            frozen = {prefix + n for n, p in self.module.named_parameters() if not p.requires_grad}
            sd = {k: v for k, v in sd.items() if k not in frozen}
        return sd

    @property
    def tput_timer(self) -> TputTimer:
        """DeepSpeed's throughput timer (:mod:`zerorun.engine.surface.tput_timer`): started at each forward,
        stopped at each step."""
        timer = self.__dict__.get("_tput_timer")
        if timer is None:
            timer = self.__dict__["_tput_timer"] = TputTimer(int(self.config.train_batch_size))
        return timer

    def destroy(self) -> None:
        """Detach the engine from the module: remove its gradient and gather hooks."""
        for handle in self.parts.hooks:
            handle.remove()
        self.parts.hooks.clear()
        coordinator = self.parts.coordinator
        for handle in getattr(coordinator, "handles", []):
            handle.remove()

    def __getattr__(self, name: str) -> Any:  # the module's attribute, whatever it is
        # only reached when normal lookup fails; forward to the module as DeepSpeed does
        module = self.__dict__.get("module")
        if module is not None and not name.startswith("__"):
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"'{type(self).__name__}' object (and its module) has no attribute '{name}'")
