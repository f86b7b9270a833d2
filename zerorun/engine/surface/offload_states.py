"""``engine.offload_states()`` / ``reload_states()``: move the model state to host memory and back.

RLHF frameworks free accelerator memory this way while another model generates. As in
DeepSpeed 0.19.8, ``include`` picks from :class:`OffloadStateTypeEnum`
(all of them when None) and the only target device is ``cpu``:

* ``optim_states``: every tensor of the optimizer state;
* ``hp_params``: the fp32 masters (with fp32 compute they are the parameter shards themselves);
* ``lp_params``: the compute copy: stages 0-2 the flat parameter buffers (the parameters are
  re-pointed at them), stage 3 the resting shards and any gathered persistent buffer;
* ``lp_grads`` / ``contiguous_grad_buffer``: zerorun holds gradients only between backward
  and step, in the gradient sync's own buffers; they stay where they are (a warning says so).

Tensors keep their identity where others hold them (``.data`` is replaced), so the optimizer
and the engine go on unchanged after ``reload_states``. Already-offloaded state (offload_optimizer,
offload_param) is on the host and stays there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from enum import Enum
from typing import TYPE_CHECKING

import torch

from zerorun.engine.errors import EngineError

if TYPE_CHECKING:
    from zerorun.engine.mechanism.buckets import FlatBucket
    from zerorun.engine.mechanism.partition import PartitionedBucket
    from zerorun.engine.views import Shards


class OffloadDeviceEnum(str, Enum):
    """Valid offload devices (DeepSpeed's values)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The state ``offload_states`` can move (DeepSpeed's values)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


S = OffloadStateTypeEnum


def _move(t: torch.Tensor, device: torch.device, pin: bool, non_blocking: bool) -> torch.Tensor:
    if t.device == device:
        return t
    out = t.to(device, non_blocking=non_blocking)
    return out.pin_memory() if pin and device.type == "cpu" and torch.cuda.is_available() else out


class StateMover:
    """Remembers where each moved group of tensors lived, so ``reload`` puts it back."""

    def __init__(self, engine: Shards) -> None:
        self.engine = engine
        self.home: dict[S, torch.device] = {}

    def offload(self, include: Iterable[OffloadStateTypeEnum | str] | None,
                device: OffloadDeviceEnum | str, pin_memory: bool, non_blocking: bool) -> None:
        target = OffloadDeviceEnum(device.value if isinstance(device, OffloadDeviceEnum) else device)
        if target is OffloadDeviceEnum.none:
            warnings.warn("offload_states(device='none'): nothing to do", stacklevel=3)
            return
        if target is OffloadDeviceEnum.nvme:
            raise EngineError("offload_states(device='nvme') is not supported (as in DeepSpeed)",
                              "offload to 'cpu', or configure offload_optimizer/offload_param with nvme")
        kinds = [S(k) for k in include] if include is not None else list(S)
        kept = [k.value for k in kinds if k in (S.lp_grads, S.contiguous_grad_buffer)]
        if kept:
            warnings.warn(f"offload_states: {', '.join(kept)} stay on the device: zerorun holds gradients only "
                          "between backward and step", stacklevel=3)
        for kind in kinds:
            if kind not in self.home and kind not in (S.lp_grads, S.contiguous_grad_buffer):
                self.home[kind] = self._apply(kind, torch.device("cpu"), pin_memory, non_blocking)

    def reload(self, non_blocking: bool) -> None:
        for kind, device in list(self.home.items()):
            self._apply(kind, device, False, non_blocking)
            del self.home[kind]

    def _apply(self, kind: S, device: torch.device, pin: bool, nb: bool) -> torch.device:
        """Move one kind of state to ``device``; returns where it was."""
        parts, optimizer = self.engine.parts, self.engine.optimizer
        masters = parts.masters
        if kind is S.optim_states:
            tensors = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim()]
            home = tensors[0].device if tensors else device
            for v in tensors:
                v.data = _move(v.data, device, pin, nb)
            return home
        if kind is S.hp_params:
            home = masters.masters[0].device
            if masters.alias:  # the masters are the compute shards: lp_params moves them
                return home
            for b, m in zip(masters.buckets, masters.masters, strict=True):
                m.data = _move(m.data, device, pin, nb)
                if getattr(b, "master", None) is not None:
                    b.master = m.data
            return home
        first = parts.buckets[0]
        home = (first.local if getattr(first, "local", None) is not None else first.data).device
        for b in [*parts.buckets, *parts.frozen]:
            self._move_bucket(b, device, pin, nb)
        if masters.alias:
            masters.rebind()
        return home

    @staticmethod
    def _move_bucket(b: FlatBucket | PartitionedBucket, device: torch.device, pin: bool, nb: bool) -> None:
        if getattr(b, "local", None) is not None:  # a stage-3 bucket: the resting shard
            b.local = _move(b.local, device, pin, nb)
            if b.state.name != "GATHERED":
                return
        b.data = _move(b.data, device, pin, nb)
        b.bind()


def state_devices(engine: Shards, kind: OffloadStateTypeEnum | str) -> set[torch.device]:
    """Where one kind of state lives now (DeepSpeed's ``get_state_devices``): one device when it is all in one
    place, the empty set when the engine holds none of it."""
    kind = S(kind)
    parts, optimizer = engine.parts, engine.optimizer
    if kind is S.hp_params:
        return {m.device for m in parts.masters.masters}
    if kind is S.lp_params:
        return {(b.local if getattr(b, "local", None) is not None else b.data).device
                for b in [*parts.buckets, *parts.frozen]}
    if kind is S.optim_states:
        return {v.device for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim()}
    accum = getattr(parts.grad_sync, "accum", None)
    if kind is S.lp_grads:
        return {a.device for a in getattr(accum, "acc", []) if a is not None}
    sync = parts.grad_sync  # contiguous_grad_buffer: the reducer's staging buffers
    return {t.device for t in [*getattr(sync, "free", []), *getattr(sync, "staging", {}).values()]}
