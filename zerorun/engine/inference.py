"""Engines without an optimizer: reference, teacher and evaluation models (forward only).

``initialize(model=m, config=cfg)`` with no optimizer and no ``optimizer`` block (what TRL's
``prepare_deepspeed`` does for a DPO reference model or a GKD teacher) builds one. It holds
no fp32 master, no optimizer state and no gradient buffers; ``engine.optimizer`` is None,
as on DeepSpeed. Stages 0-2 keep the whole model on every rank (rank 0's weights,
broadcast, in the compute dtype); stage 3 shards every parameter into the same buckets
as training does (as parameters the optimizer does not step) and gathers them around
each unit's forward through the usual coordinator. Each forward closes its gather pass,
so the first forward's order is recorded and later ones prefetch along it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.build import Parts, unit_layout
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.engine import Engine
from zerorun.engine.errors import EngineError, rank_prefixed
from zerorun.engine.mechanism.gather import GatherCoordinator, GatherPolicy
from zerorun.engine.numerics.precision import PrecisionPolicy
from zerorun.engine.policy import StagePolicy

if TYPE_CHECKING:
    from collections.abc import Callable

    from zerorun.config.schema_zero import ZeroConfig

_HINT = ("pass optimizer= to initialize() or add an `optimizer` block to the config to train this model; "
         "an engine built without one runs forward passes only")


class _NoGradients:
    """The gradient-sync slot of an engine that never reduces gradients."""

    boundary: Callable[[], bool] | None = None
    unscaled_passes = 0

    def zero(self) -> None:
        """No gradient state to clear."""

    def unwind_aborted(self) -> None:
        """No backward pass to unwind."""

    def held_bytes(self) -> tuple[int, int]:
        return 0, 0


class _NoMasters:
    """The master-shard slot of an engine that never steps."""

    def held_bytes(self) -> int:
        return 0


class _NoOptimizer:
    """Stands in for the optimizer while :class:`Engine` wires ``zero_grad``; replaced by None after."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No gradients to clear."""


def build_inference_parts(module: nn.Module, coll: Collectives, stage: StagePolicy, precision: PrecisionPolicy,
                          zero_cfg: ZeroConfig, device: torch.device) -> Parts:
    if not stage.shard_parameters:
        with torch.no_grad():  # every rank computes with rank 0's weights, as after a training engine's build
            for t in {id(t): t for t in (*module.parameters(), *module.buffers())}.values():
                coll.broadcast(t.data, src=0)
        module.to(precision.compute_dtype)
        return Parts([], _NoMasters(), _NoGradients(), [])  # type: ignore[arg-type]
    layout = unit_layout(module, [], coll, precision, zero_cfg, device)
    coll.open_shared_lane(layout.largest())
    module.to(precision.compute_dtype)
    coordinator = GatherCoordinator(layout.frozen, layout.units, GatherPolicy.from_config(zero_cfg))
    coordinator.attach(module, layout.modules)
    return Parts([], _NoMasters(), _NoGradients(), [], layout.frozen, coordinator, layout.units)  # type: ignore[arg-type]


class InferenceEngine(Engine):
    """An :class:`Engine` whose ``backward``/``step`` raise; ``optimizer`` is None."""

    def __init__(self, module: nn.Module, *args: Any) -> None:
        super().__init__(module, _NoOptimizer(), *args)  # type: ignore[arg-type]
        self.optimizer = None  # type: ignore[assignment]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        coordinator = self.parts.coordinator
        if coordinator is not None and not torch_compat.in_backward():
            coordinator.end_pass()  # no backward follows: release what is gathered, record the first order
        return out

    def _refuse(self, what: str) -> EngineError:
        return EngineError(rank_prefixed(self.ctx.rank, f"engine.{what}() on an engine built without an "
                                         "optimizer (initialize() got none and the config has no `optimizer` "
                                         "block)"), _HINT)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        raise self._refuse("backward")

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> None:
        raise self._refuse("step")

    def get_lr(self) -> list[float]:
        return []

    def num_parameters(self) -> int:
        """Parameters managed by the engine (without padding); none is trained."""
        return sum(b.plan.numel for b in self.parts.frozen)

    def memory_breakdown(self) -> dict[str, int]:
        """As :meth:`Engine.memory_breakdown`; gradients, masters and optimizer state are always 0."""
        from zerorun.engine import metrics

        params = sum(b.held_bytes() for b in self.parts.frozen)
        if not self.stage.shard_parameters:  # the whole model, in no bucket
            params = sum(t.numel() * t.element_size() for t in {id(p): p for p in self.module.parameters()}.values())
        return metrics.memory_breakdown(params, 0, 0, 0, 0)
