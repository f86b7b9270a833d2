"""The exception a rank died of, read from the last lines of its stderr: its line and where it was raised.

A rank that raises ``ValueError("bad lr")`` prints a traceback; the failure report's box
quotes its last line (``ValueError: bad lr``) and the frame that raised it (``train.py:12
in main``), so the root cause is readable in the box even when the traceback scrolled away
or was printed by every rank. The tail may start mid-traceback (only its last lines are
kept): the last ``File "...", line N`` frame and the first unindented line after it are
enough. Lines without a traceback (zerorun's own ``error:``/``hint:`` lines) give None.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.watch.once import text_of

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_TYPE = re.compile(r"^[A-Za-z_][\w.]*$")
_LIBRARY = ("site-packages", "dist-packages", "<frozen", "/lib/python")
MAX_MESSAGE = 300


@dataclass(frozen=True)
class Raised:
    """An exception seen in a rank's stderr."""

    line: str
    """``Type: message`` as Python printed it (the message cut at ``MAX_MESSAGE`` characters)."""
    where: str | None
    """``path:line in func`` of the frame that raised it, with the script's own frame when that differs."""


def _short(path: str) -> str:
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if os.path.isabs(path) and path.startswith(cwd + os.sep) else path


def _frame(match: re.Match[str]) -> str:
    return f"{_short(match['path'])}:{match['line']} in {match['func'].strip()}"


def raised(tail: Sequence[str]) -> Raised | None:
    """The last exception of ``tail`` (lines with or without the launcher's prefixes), or None."""
    texts = [text_of(line) for line in tail]
    starts = [i for i, t in enumerate(texts) if t.startswith("Traceback (most recent call last)")]
    texts = texts[starts[-1]:] if starts else texts  # a chain's last traceback is the one that killed the rank
    frames = [(i, m) for i, m in ((i, _FRAME.match(t)) for i, t in enumerate(texts)) if m]
    if not frames:
        return None
    last, frame = frames[-1]
    for text in texts[last + 1:]:
        if not text.strip() or text[:1].isspace():
            continue  # the frame's source line, its ^^^^ markers
        if not _TYPE.match(text.split(":", 1)[0]):
            return None
        line = text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "..."
        where = _frame(frame)
        own = [m for _, m in frames if not any(lib in m["path"] for lib in _LIBRARY)]
        if own and own[-1] is not frame:
            where += f" (from {_frame(own[-1])})"
        return Raised(line, where)
    return None
