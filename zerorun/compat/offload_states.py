"""``deepspeed.runtime.zero.offload_states``: where ``engine.offload_states()`` left each kind of state.

``get_state_devices(engine, state)`` answers in zerorun's terms
(:func:`zerorun.engine.surface.offload_states.state_devices`): the fp32 masters, the resting parameter
shards (the flat parameter buffers at stages 0-2), the optimizer state, the gradient sums, the reducer's
staging buffers. DeepSpeed's ``offload_adam_states`` / ``reload_adam_states`` move Adam's state alone:
``engine.offload_states(include=[OffloadStateTypeEnum.optim_states])`` does that here.
"""

from __future__ import annotations

from typing import Any

import torch

from zerorun.engine.surface.offload_states import OffloadStateTypeEnum, state_devices


def get_state_devices(model: Any, state: OffloadStateTypeEnum | str) -> set[torch.device]:
    """The devices ``state`` of ``model`` (an engine) lives on now."""
    return state_devices(model, state)


__all__ = ["get_state_devices"]
