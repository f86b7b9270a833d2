"""A backward the script runs itself, divided by the accumulation steps as DeepSpeed 0.19.8 divides it.

``engine.backward(loss)`` divides the loss by ``gradient_accumulation_steps``. DeepSpeed 0.19.8 makes every
other backward through the engine's outputs do the same: its forward hooks each output tensor with a
``grad_fn`` (in tuples, lists and dicts, so a Hugging Face ``ModelOutput`` too), and the hook divides the
gradient reaching it, unless an ``engine.backward`` runs that backward (any engine's: a loss summed over two
engines is divided once) or torch.func is transforming it. So ``loss.backward()``, ``output.backward(grad)``
and ``engine.scale(loss).backward()`` give ``engine.backward(loss)``'s gradients, and a script moved from
DeepSpeed keeps its learning rate's meaning under accumulation. At one accumulation step nothing is
divided. A module called past the engine (``engine.module(x)``) is not hooked, as in DeepSpeed.

Under fp16's dynamic loss scale the same hooks refuse a plain backward that ``engine.scale(loss)`` did not
scale, as DeepSpeed refuses it (a ``RuntimeError``, "Loss scaling is required ..."): its gradients would be
unscaled and the step would divide them by the scale. zerorun raises as the backward starts, before any
gradient lands, so nothing is left to undo; DeepSpeed raises after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from zerorun import torch_compat
from zerorun.engine.errors import LossScalingRequired, rank_prefixed

_engine_backwards = 0  # engine.backward calls running now (their loss is divided already)


@contextmanager
def engine_backward() -> Iterator[None]:
    """Mark the backward run inside as ``engine.backward``'s: the output hooks leave it alone."""
    global _engine_backwards
    _engine_backwards += 1
    try:
        yield
    finally:
        _engine_backwards -= 1


def hook_outputs(outputs: object, steps: int, rank: int, unscaled: Callable[[], bool] | None = None) -> None:
    """Hook the forward's outputs: a backward the script runs itself is divided by ``steps`` and, where
    ``unscaled`` is given, refused on ``rank`` when it says the loss needed ``engine.scale`` and did not get it."""
    if (steps == 1 and unscaled is None) or not torch.is_grad_enabled():
        return

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if _engine_backwards or torch_compat.functorch_transforming():
            return grad
        if unscaled is not None and unscaled():
            raise LossScalingRequired(rank_prefixed(
                rank, "Loss scaling is required for this configuration, but backward() was called directly "
                "without scaling the loss (fp16's dynamic loss scale)"),
                "use engine.backward(loss), or engine.scale(loss).backward()")
        return grad / steps if steps != 1 else grad

    for tensor in _grad_outputs(outputs):
        tensor.register_hook(hook)


def _grad_outputs(outputs: object) -> Iterator[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        if outputs.grad_fn is not None:
            yield outputs
    elif isinstance(outputs, (tuple, list)):
        for item in outputs:
            yield from _grad_outputs(item)
    elif isinstance(outputs, dict):
        for item in outputs.values():
            yield from _grad_outputs(item)
