"""Collectives issued from a gradient hook, without the Python object backward keeps in thread-local state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from zerorun import torch_compat

# torch's backward stashes a contextvars.Context in thread-local state under this key, and
# every collective issued meanwhile (from a gradient hook) copies that state into its work.
_BACKWARD_TLS_KEY = "context"


@contextmanager
def outside_backward_tls() -> Iterator[None]:
    """Issue a collective without the Python object backward keeps in thread-local state.

    A gloo work that holds it needs the GIL to be freed, and gloo's worker thread frees a
    finished work itself: when that happens while the interpreter is finalizing, the
    rank aborts ("terminate called without an active exception", ~1 run in 20 of a
    2-rank job that exits right after its last backward). The exit path
    (:mod:`zerorun.engine.teardown`) now also frees the groups, joining gloo's threads, before the
    interpreter finalizes; this guard keeps a work from holding the object meanwhile.
    """
    with torch_compat.detached_tls(_BACKWARD_TLS_KEY):  # a torch that cannot detach it: left as it is
        yield
