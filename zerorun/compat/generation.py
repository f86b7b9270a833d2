"""``deepspeed.runtime.zero.unwrap_model_for_generation``: the whole model, gathered and unhooked, for ``generate()``.

RLHF loops (TRL's GRPO, RLOO, online DPO) generate with the policy they train::

    with unwrap_model_for_generation(engine):
        outputs = engine.module.generate(prompts)

At stage 3 every parameter is all-gathered once for the body (``GatheredParameters``) and the
engine's gather hooks are taken off, so the many small forwards of generation run on plain
tensors without a collective each; on exit the hooks go back (``parameter_offload``) and the
parameters are sharded again. Below stage 3 nothing is sharded and nothing is hooked: the
engine is yielded as it is (DeepSpeed's own version assumes stage 3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from zerorun.zero import GatheredParameters


@contextlib.contextmanager
def unwrap_model_for_generation(model: Any) -> Iterator[Any]:
    """Gather ``model``'s (an engine's) parameters and lift its stage-3 hooks for the body; yields ``model``."""
    optimizer = getattr(model, "optimizer", None)
    offload = getattr(optimizer, "parameter_offload", None)
    with GatheredParameters(list(model.parameters())):
        if offload is None:  # stages 0-2: nothing to lift
            yield model
            return
        for handle in [*offload.forward_hooks, *offload.backward_hooks]:
            handle.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield model
        finally:
            offload._register_deepspeed_module(offload.module)
