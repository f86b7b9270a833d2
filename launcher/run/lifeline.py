"""A child that dies with its parent: ``prctl(PR_SET_PDEATHSIG)`` set between fork and exec.

The launcher starts srun and mpirun, and the shim starts the user's rank, with this
lifeline, so a SIGKILLed launcher (or shim) still takes its job down: srun and mpirun
get SIGTERM and tear the job down on every node; a rank gets SIGKILL. Linux only; a
no-op elsewhere. The signal follows the *thread* that started the child: the executor
and the shim start them from their main thread, which lives as long as they do.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``signum`` when this process dies."""
    parent = os.getpid()
    try:  # resolved here, not in the forked child, which should do as little as possible
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no lifeline
        return lambda: None

    def arm() -> None:
        with contextlib.suppress(OSError):
            prctl(PR_SET_PDEATHSIG, int(signum))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(128 + int(signum))

    return arm
