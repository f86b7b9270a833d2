"""``resident(masters)``: a context in which master shards and optimizer state are in memory.

In memory already for no offload and CPU offload; NVMe offload reads them in for the
duration (checkpoint save/load) and writes them back out afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zerorun.engine.offload import Masters


@contextlib.contextmanager
def resident(masters: Masters) -> Iterator[None]:
    enter = getattr(masters, "resident", None)
    if enter is None:
        yield
        return
    with enter():
        yield
