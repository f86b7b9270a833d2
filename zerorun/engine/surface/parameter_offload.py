"""``engine.optimizer.parameter_offload``: DeepSpeed's handle on stage 3's module hooks, over the gather coordinator.

Generation helpers written for DeepSpeed ZeRO-3 (TRL's ``unwrap_model_for_generation``,
used by GRPO, RLOO, online DPO and GKD) gather every parameter, take the hooks off so
``generate()`` runs on plain tensors, and put them back after::

    with deepspeed.zero.GatheredParameters(model.parameters()):
        off = model.optimizer.parameter_offload
        for p in params(off.module): p.ds_active_sub_modules.clear()
        for h in off.forward_hooks + off.backward_hooks: h.remove()
        off.forward_hooks, off.backward_hooks = [], []
        yield model.module                                   # generate() here
        off.param_coordinator._invalidate_trace()            # when not invalid already
        off._register_deepspeed_module(off.module)

Here ``forward_hooks`` are the coordinator's own handles (its module pre/post-forward
hooks; zerorun's backward hooks are per-pass tensor hooks, so ``backward_hooks`` holds
none), ``_register_deepspeed_module`` attaches the coordinator to the same units again,
and invalidating the trace drops the recorded gather order: the next training pass runs
on demand and records it anew, as after DeepSpeed's ``_invalidate_trace``. A parameter used
outside its module is filed under the unit using it; one a module returns to its caller is
also recorded as DeepSpeed records it (``_external_params``, ``ds_external_parameters()``:
:mod:`zerorun.engine.surface.external_params`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from zerorun.engine.mechanism.gather import GatherCoordinator, Unit
from zerorun.engine.surface import external_params, zero_ordered_dict

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle


def install_module_surface(module: nn.Module, coordinator: GatherCoordinator) -> None:
    """What DeepSpeed's stage 3 puts on every module of its model, training or forward-only: the record of
    external parameters, and ``ZeROOrderedDict`` as each parameter dict (late-attached modules too)."""
    external_params.install(module)
    coordinator.on_returned = external_params.record_returned
    zero_ordered_dict.install(module)


class TraceHandle:
    """``parameter_offload.param_coordinator``: the coordinator's recorded order, in DeepSpeed's terms."""

    def __init__(self, coordinator: GatherCoordinator) -> None:
        self._coordinator = coordinator

    def is_invalid_trace(self) -> bool:
        """No order recorded to follow (before the first training pass, or after an invalidation)."""
        return self._coordinator.trace is None

    def is_record_trace(self) -> bool:
        return self._coordinator.trace is None and bool(self._coordinator.current)

    def is_complete_trace(self) -> bool:
        return self._coordinator.trace is not None

    def _invalidate_trace(self) -> None:
        """Forget the recorded order (between passes): the next pass gathers on demand and records it again."""
        if self.is_invalid_trace():
            raise RuntimeError("attempted to invalidate already invalid trace")  # DeepSpeed's check and words
        c = self._coordinator
        c.trace, c.on_order, c.pos = None, False, 0


class ParameterOffload:
    """The hooks of one stage-3 engine's module, as ``DeepSpeedZeRoOffload`` exposes them."""

    def __init__(self, module: nn.Module, coordinator: GatherCoordinator, units: list[Unit]) -> None:
        self.module = module
        self.param_coordinator = TraceHandle(coordinator)
        self.backward_hooks: list[RemovableHandle] = []
        self._coordinator = coordinator
        self._units = units
        install_module_surface(module, coordinator)

    @property
    def forward_hooks(self) -> list[RemovableHandle]:
        return self._coordinator.handles

    @forward_hooks.setter
    def forward_hooks(self, handles: list[RemovableHandle]) -> None:
        self._coordinator.handles = list(handles)

    def _register_deepspeed_module(self, module: nn.Module, count: list[int] | None = None) -> None:
        """Attach the coordinator's hooks to ``module``'s units again (after they were removed)."""
        if module is not self.module:
            raise ValueError("zerorun re-attaches stage-3 hooks to the engine's own module only")
        for handle in self._coordinator.handles:  # never twice: a second set would gather and count twice
            handle.remove()
        self._coordinator.handles = []
        by_name = dict(module.named_modules())
        self._coordinator.attach(module, [module if u.name == "<root>" else by_name[u.name] for u in self._units])
