"""ZeRO stage 3 helpers (``zero.Init``, ``GatheredParameters``): not available yet.

Stages 0-2 keep full parameters on every rank, so for them ``GatheredParameters`` is a
no-op context (the parameters are already whole) and ``Init`` builds the model normally.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def Init(*args: Any, **kwargs: Any) -> Iterator[None]:  # noqa: N802 - DeepSpeed's name
    """Stage 3 only in DeepSpeed; with stages 0-2 the model is built unsharded."""
    yield


@contextlib.contextmanager
def GatheredParameters(params: Any, modifier_rank: int | None = None, **kwargs: Any) -> Iterator[None]:  # noqa: N802
    """With stages 0-2 every rank already holds full parameters: nothing to gather."""
    yield
