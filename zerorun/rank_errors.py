"""zerorun's own errors inside a rank: the message and its hint, no traceback.

A config error, a lost peer or an unsupported feature is zerorun telling the user what
to fix; the frames of zerorun's internals above it are noise (seven of them for a bad
config, seventeen for a lost peer), printed by every rank. ``import zerorun`` puts this
hook in front of Python's: a :class:`~zerorun.errors.ZerorunError` that no one caught
prints ``error: ...`` and ``hint: ...`` and the process exits 1, as the CLI does.
``ZERORUN_DEBUG=1`` (the launcher's ``--debug``) keeps the full traceback. Every other
exception - the user's own - goes to the previous hook unchanged. torch.distributed
wraps whatever hook it finds with its ``[rankN]:`` prefix, so the lines still say which
rank spoke; the launcher shows lines every rank prints alike once (launcher/watch/once.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

DEBUG_ENV = "ZERORUN_DEBUG"


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


class _Hook:
    """``sys.excepthook`` for zerorun's errors; everything else goes to ``previous``."""

    def __init__(self, previous: Callable[[type[BaseException], BaseException, TracebackType | None], Any]) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        from zerorun.errors import ZerorunError

        if isinstance(value, ZerorunError) and not debugging():
            sys.stderr.write(f"error: {value.message}\n")
            if value.hint:
                sys.stderr.write(f"hint: {value.hint}\n")
            sys.stderr.flush()
            return
        self.previous(kind, value, tb)


def install() -> None:
    """Put the hook in front of the current ``sys.excepthook`` (once per process)."""
    if not isinstance(sys.excepthook, _Hook):
        sys.excepthook = _Hook(sys.excepthook)
