"""The one door through which set-up moves model state onto the engine's device.

Stage 3 never calls ``model.to(device)`` on the whole model: ``zero.Init`` and
``initialize`` move one unit's parameters at a time (then shard them), and the buffers
module by module, each through :func:`to_device`. Routing every move through one
function makes the set-up's device traffic countable: :func:`watch_moves` calls an
observer with each batch of tensors before it moves, which is how the tests prove that
at most one unit is ever whole on the device while the model is being set up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

Observer = Callable[[list[torch.Tensor], torch.device], None]
_observers: list[Observer] = []


def to_device(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Move ``tensors`` (one unit's parameters, or one module's buffers) to ``device``."""
    for observe in _observers:
        observe(tensors, device)
    return [t.to(device) for t in tensors]


@contextlib.contextmanager
def watch_moves(observer: Observer) -> Iterator[None]:
    """Call ``observer(tensors, device)`` before every set-up move inside the ``with``."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)
