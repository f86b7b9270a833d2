"""The Engine: DeepSpeed's training-loop surface over the shared ZeRO mechanism.

    loss = criterion(engine(x), y)
    engine.backward(loss)   # scaled by the loss scale and 1/gradient_accumulation_steps
    engine.step()           # steps the optimizer on the accumulation boundary only

A plain ``loss.backward()`` reduces the gradients too (see :mod:`zerorun.engine.mechanism.grad_sync`),
divided by the accumulation steps as DeepSpeed divides it (:mod:`zerorun.engine.training.plain_backward`),
and ``model.zero_grad()`` / ``optimizer.zero_grad()`` drop the engine's gradients as ``engine.zero_grad()``
does.

The engine holds the parts (buckets, master shards, gradient sync) and sequences them;
it never asks which ZeRO stage it runs.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from zerorun.engine import metrics, physical_memory, teardown
from zerorun.engine.build import Parts
from zerorun.engine.comm.bootstrap import DistContext
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.errors import DeepSpeedAssertion, EngineError
from zerorun.engine.mechanism.grad_sync import route_zero_grad
from zerorun.engine.mechanism.masters import optimizer_state_bytes
from zerorun.engine.numerics import loss_scaler
from zerorun.engine.numerics.grad_norm import clip_multiplier, global_norm_sq
from zerorun.engine.numerics.precision import PrecisionPolicy
from zerorun.engine.policy import StagePolicy
from zerorun.engine.surface import fragments
from zerorun.engine.surface.compile_surface import CompileSurface
from zerorun.engine.surface.ds_surface import DeepSpeedSurface
from zerorun.engine.surface.hf_surface import HfSurface
from zerorun.engine.training.plain_backward import engine_backward, hook_outputs
from zerorun.engine.trial import recorder_for
from zerorun.heartbeat.state import PROGRESS, Phase

if TYPE_CHECKING:
    from collections.abc import Callable

    from zerorun.config.schema import ZerorunConfig
    from zerorun.engine.training.dataloader import TrainingDataLoader
    from zerorun.engine.training.schedulers import LRSchedulerLike


_T = TypeVar("_T")  # _cast_inputs: the same structure of inputs, floating tensors cast


class NonFiniteGradientWarning(RuntimeWarning):
    """A bf16/fp32 step saw an inf/nan loss or gradient and was skipped."""


class UnscaledBackwardWarning(RuntimeWarning):
    """An fp16 step's backward passes all ran without the loss scale (a plain ``loss.backward()`` past the
    engine's forward): they are stepped as they are, unscaled."""


def _cast_inputs(obj: _T, dtype: torch.dtype) -> _T:
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_inputs(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast_inputs(v, dtype) for k, v in obj.items()}
    return obj


class Engine(DeepSpeedSurface, HfSurface, CompileSurface):
    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: LRSchedulerLike | None, config: ZerorunConfig,
                 ctx: DistContext, coll: Collectives, stage: StagePolicy, precision: PrecisionPolicy,
                 parts: Parts) -> None:
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.config = config
        self.ctx = ctx
        self.coll = coll
        self.stage = stage
        self.precision = precision
        self.parts = parts
        self.scaler = loss_scaler.initial_state(precision.scaler)
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        """Samples consumed by every rank together (DeepSpeed's name): ``train_batch_size`` per optimizer
        step at the world of that step, so it stays right across an elastic restart at another world -
        a script with its own sampler resumes its global position from it."""
        self.skipped_steps = 0
        self.training_dataloader: TrainingDataLoader | None = None
        """The loader ``initialize(training_data=...)`` built; checkpoints carry its data position."""
        self._grad_norm: float | None = None
        self._last_loss: torch.Tensor | None = None
        self.throughput = metrics.Throughput(samples_per_step=config.train_batch_size)
        PROGRESS.samples_per_step = int(config.train_batch_size)  # the live view's samples/s
        self._trial = recorder_for(self)  # None unless `zerorun autotune` runs this as a trial
        self._warned_unscaled = False  # UnscaledBackwardWarning is said once
        # read once, not per step: ZERORUN_TRIM_HEAP=0 keeps glibc's free heap (see the step's end)
        self._trim_heap = ctx.device.type == "cpu" and os.environ.get("ZERORUN_TRIM_HEAP", "1") != "0"
        parts.grad_sync.boundary = self.is_gradient_accumulation_boundary  # for plain loss.backward()
        route_zero_grad([module, optimizer], parts.grad_sync)
        fragments.register(self)  # deepspeed.utils.safe_get_full_*(param) find the engine from the parameter
        teardown.track(self)  # destroyed at exit if the script does not call destroy() (zerorun.engine.teardown)

    # ---- the training loop -------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module on the inputs as given (DeepSpeed's rule): only ``fp16.auto_cast`` casts the
        floating positional inputs to fp16; keyword inputs, and every input under bf16, stay as they are.
        With accumulation, the outputs divide a backward the script runs itself (``loss.backward()``) by
        the accumulation steps, and under fp16's dynamic loss scale they refuse one ``engine.scale`` did not
        scale, as DeepSpeed's do."""
        PROGRESS.enter(Phase.FORWARD)
        self.parts.grad_sync.unwind_aborted()  # a backward that raised is unwound first (one flag read if none)
        self.tput_timer.start()
        if self.config.fp16.auto_cast:
            args = _cast_inputs(args, torch.float16)
        with self._autocast():  # torch_autocast (see DeepSpeedSurface._autocast)
            outputs = self.module(*args, **kwargs)
        hook_outputs(outputs, self.gradient_accumulation_steps(), self.ctx.rank,
                     self._unscaled_plain_backward if self.precision.scaler.dynamic else None)
        return outputs

    def _unscaled_plain_backward(self) -> bool:
        """A plain backward under fp16's dynamic scale that ``engine.scale(loss)`` did not scale."""
        return not self.parts.grad_sync.scaled_ahead

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backpropagate ``loss`` (times the loss scale, divided by the accumulation steps)."""
        PROGRESS.enter(Phase.BACKWARD)
        self._last_loss = loss.detach()
        factor = self.scaler.scale / (self.gradient_accumulation_steps() if scale_wrt_gas else 1)
        sync = self.parts.grad_sync
        sync.prepare_backward(self.is_gradient_accumulation_boundary())
        with engine_backward():  # divided here already: the outputs' hooks leave it
            (loss * factor if factor != 1.0 else loss).backward(retain_graph=retain_graph)
        sync.finish_backward()
        return loss

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's manual backward, ``engine.scale(loss).backward()``: ``loss`` times the loss scale (fp16's;
        1 otherwise), as DeepSpeed's; the engine's outputs divide that backward by the accumulation steps,
        and it counts as scaled, so the step unscales it as after ``engine.backward(loss)``."""
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.grad_fn is not None):
            raise DeepSpeedAssertion("loss must be a scalar tensor with grad_fn. For non-scalar tensors, use "
                                     "tensor.backward(grad)", "pass the scalar loss the module's output gives")
        self.parts.grad_sync.scaled_ahead = True
        factor = self.scaler.scale
        return loss * factor if factor != 1.0 else loss

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> None:
        """Count a micro-step; on the accumulation boundary, take the optimizer step."""
        self._check_step_allowed()
        self.parts.grad_sync.unwind_aborted()  # a backward that raised adds nothing to the step
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            PROGRESS.enter(Phase.STEP)
            self._optimizer_step()
            PROGRESS.step_done(self.global_steps)
        self.tput_timer.stop(global_step=boundary)
        self.micro_steps += 1
        PROGRESS.micro_step = self.micro_steps
        PROGRESS.enter(Phase.SCRIPT)  # until the next engine call, the rank runs the script's own code

    def _optimizer_step(self) -> None:
        parts = self.parts
        scale = self._unscale_by()
        parts.grad_sync.check_all_used()  # ignore_unused_parameters: false (DeepSpeed's CPU-offload path)
        if self._trim_heap:
            # backward's freed buffers, kept by glibc, would sit under the step's own peak (BENCHMARKS.md,
            # issue 48): handed back first when there is much of it
            physical_memory.trim_heap_if_large()
        owned = parts.grad_sync.owned_grads()
        # over the shard group: each one holds a whole gradient (MiCS's replicas summed theirs already)
        norm_sq = global_norm_sq(owned, self.stage.shard_optimizer, self.shard_coll)
        overflow = not math.isfinite(norm_sq)  # a float already: no tensor, no second host read
        self.optimizer.overflow = overflow  # type: ignore[attr-defined]  # accelerate: was the step skipped?
        if overflow:
            self.skipped_steps += 1
            self._grad_norm = None
            if not self.precision.scaler.dynamic:
                warnings.warn(f"[rank {self.ctx.rank}] step {self.global_steps}: the loss or a gradient is "
                              f"inf/nan in {self.precision.name}; the optimizer step is skipped on every rank "
                              "(check the learning rate, the inputs and the loss)",
                              NonFiniteGradientWarning, stacklevel=3)
        else:
            self._grad_norm = norm_sq ** 0.5 / scale
            multiplier = clip_multiplier(norm_sq, scale, self.config.gradient_clipping)
            parts.masters.step(self.optimizer, owned, multiplier, self.coll)
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        self.scaler = loss_scaler.update(self.scaler, self.precision.scaler, overflow)
        parts.grad_sync.zero()
        self.global_steps += 1
        self.global_samples += self.config.train_batch_size
        self.throughput.tick()
        self._report()
        if self._trial is not None:
            self._trial.step_done()
        if self._trim_heap:
            # The step's buffers are free now. glibc keeps freed heap chunks of up to 32 MiB resident; the
            # next step faults trimmed pages in again, so only a heap with much free (over 32 MiB and a
            # quarter of the resident set) is trimmed: a trim every step cost stage 3 a fifth of its step
            # time for 3% of the peak (BENCHMARKS.md, issue 48); ZERORUN_TRIM_HEAP=0 never trims.
            physical_memory.trim_heap_if_large()

    def _unscale_by(self) -> float:
        """The factor this step's gradients carry: the loss scale, or 1 where every backward pass of the window
        ran unscaled (a plain ``loss.backward()`` of a module called past the engine, as DeepSpeed's
        multiple-models scripts run one; DeepSpeed would divide such gradients by the scale all the same)."""
        sync, scale = self.parts.grad_sync, self.scaler.scale
        if not sync.unscaled_passes or scale == 1.0:
            return scale
        if sync.unscaled_passes < sync.window_passes:
            raise EngineError(f"[rank {self.ctx.rank}] this step sums backward passes run with {self.precision.name}'s "
                              f"loss scale ({scale:g}) and plain loss.backward() passes run without it: the sum "
                              "cannot be unscaled", "scale every pass alike: engine.backward(loss) (or "
                              "engine.scale(loss).backward()) for all of them")
        if not self._warned_unscaled:
            self._warned_unscaled = True
            warnings.warn(f"[rank {self.ctx.rank}] the backward passes of step {self.global_steps} ran without "
                          f"{self.precision.name}'s loss scale (a plain loss.backward() past engine(...)): their "
                          "gradients are stepped unscaled, and small ones may have underflowed; use "
                          "engine.backward(loss) or engine.scale(loss).backward() (said once)",
                          UnscaledBackwardWarning, stacklevel=4)
        return 1.0

    def _report(self) -> None:
        every = self.config.steps_per_print
        if self.ctx.rank != 0 or not every or self.global_steps % every:
            return
        loss = float(self._last_loss) if self._last_loss is not None else None
        # global_steps counts optimizer steps from 1 (DeepSpeed's numbering): the first step is "step 1"
        line = metrics.format_progress(self.global_steps, loss, self.get_lr(), self.throughput.rates(),
                                       self.loss_scale, self.skipped_steps)
        print(f"[zerorun] {line}", flush=True)
        if self.config.memory_breakdown:
            print(f"[zerorun] step {self.global_steps} memory: {metrics.format_memory(self.memory_breakdown())}",
                  flush=True)

    def destroy(self) -> None:
        """Finish and release what the engine started: collectives in flight, hooks, offload threads and
        files, the shared-memory lane (idempotent; every rank calls it, as it calls ``step``). The process
        group stays (DeepSpeed's semantics): see :mod:`zerorun.engine.teardown`."""
        teardown.destroy(self)

    # ---- DeepSpeed-shaped accessors -----------------------------------------------------------
    def zero_grad(self) -> None:
        self.parts.grad_sync.zero()

    def gradient_accumulation_steps(self) -> int:
        return int(self.config.gradient_accumulation_steps)

    def train_micro_batch_size_per_gpu(self) -> int:
        return int(self.config.train_micro_batch_size_per_gpu)

    def train_batch_size(self) -> int:
        return int(self.config.train_batch_size)

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        return self._grad_norm

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    @property
    def zero_stage(self) -> int:
        return self.stage.stage

    @property
    def local_rank(self) -> int:
        return self.ctx.local_rank

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    def train(self, mode: bool = True) -> Engine:
        self.module.train(mode)
        return self

    def eval(self) -> Engine:
        return self.train(False)

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self.module.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.module.state_dict(*args, **kwargs)

    def save_16bit_model(self, save_dir: str, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """Write the full 16-bit (compute-dtype) state dict; rank 0 writes, stage 3 gathers unit by unit."""
        from zerorun.engine.checkpoint.save16 import save_16bit_model

        return save_16bit_model(self, save_dir, save_filename, exclude_frozen_parameters)

    def set_sequence_length(self, tokens_per_sample: int) -> None:
        """Report tokens/s too (tokens per sample = the sequence length)."""
        self.throughput.tokens_per_sample = tokens_per_sample
        PROGRESS.tokens_per_sample = tokens_per_sample

    # ---- figures ------------------------------------------------------------------------------
    def memory_breakdown(self) -> dict[str, int]:
        """Bytes of model state this rank holds, then what the process holds physically (its peak since
        :meth:`reset_memory_peak`); see :mod:`zerorun.engine.metrics` for each key."""
        parts = self.parts
        grads, buffers = parts.grad_sync.held_bytes()
        # stage 3 also shards the parameters the optimizer does not step (frozen buckets)
        params = sum(b.held_bytes() for b in [*parts.buckets, *parts.frozen])
        return {**metrics.memory_breakdown(params, grads, parts.masters.held_bytes(),
                                           optimizer_state_bytes(self.optimizer), buffers),
                **physical_memory.physical_figures(self.device)}

    def reset_memory_peak(self) -> bool:
        """Start a new physical peak window for ``memory_breakdown()`` (host high-water mark, CUDA peaks).

        False where the host peak cannot be reset here (no writable ``/proc/self/clear_refs``)."""
        return physical_memory.reset_peak(self.device)

    @property
    def shard_coll(self) -> Collectives:
        """The group the model states are sharded over: the world, or MiCS's shard group."""
        groups = self.parts.groups
        return groups.shard if groups is not None else self.coll

    def comm_stats(self) -> dict[str, dict[str, int | str]]:
        """Calls, bytes and elements per collective kind since the engine started (every group together)."""
        groups = self.parts.groups
        if groups is None or len(groups.by_name()) == 1:
            return self.coll.counter.snapshot()
        return metrics.sum_counts([c.counter.snapshot() for c in groups.by_name().values()])

    def comm_stats_by_group(self) -> dict[str, dict[str, dict[str, int | str]]]:
        """:meth:`comm_stats` per process group: ``world``, and ``shard``, ``replica`` (MiCS), ``secondary``
        (hpZ), ``inter``/``intra`` (MiCS's hierarchical gather) where the policy has them."""
        groups = self.parts.groups
        named = groups.by_name() if groups is not None else {"world": self.coll}
        return {name: c.counter.snapshot() for name, c in named.items()}

    def num_parameters(self) -> int:
        """Trainable parameters managed by the engine (without padding)."""
        return sum(b.plan.numel for b in self.parts.buckets)

    # ---- checkpoints (zerorun.engine.checkpoint) ----------------------------------------------
    def save_checkpoint(self, save_dir: str, tag: str | None = None, client_state: dict[str, Any] | None = None,
                        save_latest: bool = True, exclude_frozen_parameters: bool = False) -> str:
        """Save ``save_dir/tag`` (never torn; loadable at any world size); every rank calls it.

        ``exclude_frozen_parameters`` (DeepSpeed's): the parameters that do not train (``requires_grad=False``,
        a LoRA model's base weights) are left out; loading such a checkpoint keeps the module's own."""
        from zerorun.engine.checkpoint import save_checkpoint

        with PROGRESS.during(Phase.SAVE):  # its file I/O counts as progress (a long write is no stall)
            return str(save_checkpoint(self, save_dir, tag, client_state or {}, save_latest,
                                       exclude_frozen_parameters))

    def load_checkpoint(self, load_dir: str, tag: str | None = None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, custom_load_fn: Callable[..., Any] | None = None,
                        load_rng_state: bool = False, trust_checkpoint: bool = False
                        ) -> tuple[str, dict[str, Any]] | tuple[None, None]:
        """Load ``load_dir/tag`` (``latest`` by default) at any world size/stage; returns ``(path, client_state)``.

        The global RNG states saved with it are restored only with ``load_rng_state=True``
        (DeepSpeed does not restore them). Files load as data only; ``trust_checkpoint=True``
        (files you vouch for) allows any pickled global, e.g. a client_state of your own classes.
        """
        from zerorun.engine.checkpoint import load_checkpoint

        if custom_load_fn is not None:
            from zerorun.errors import unsupported

            unsupported("load_checkpoint(custom_load_fn=...)")
        with PROGRESS.during(Phase.LOAD):
            return load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states,
                                   load_module_only, strict=load_module_strict, load_rng_state=load_rng_state,
                                   trust_checkpoint=trust_checkpoint)
