"""Each message once: what every rank prints alike reaches the console from the first rank only.

A bad config read by every rank, or a lost peer seen by all of them, is one problem;
printed by each rank it is N copies to read through. The launcher's console (every
node's output, ``[host:rank] text``) passes each stderr line through :class:`OnceFilter`:
zerorun's own error lines (``error: ...``, ``hint: ...``, as zerorun/rank_errors.py
writes them) that a rank already printed are held back, and the ranks that repeated
them are remembered for the failure report ("raised alike by ranks 0, 1"). Any other
line goes through: a user's traceback is shown in full, from every rank.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

_PREFIX = re.compile(r"^\[(?P<host>[^\]\s]*):(?P<rank>\d+)\] ")
_TORCH_RANK = re.compile(r"^\[rank\d+\]: ")
ONCE_STARTS = ("error: ", "hint: ")
REMEMBERED = 2000


def text_of(line: str) -> str:
    """The line without the launcher's ``[host:rank] `` and torch's ``[rankN]: `` prefixes."""
    return _TORCH_RANK.sub("", _PREFIX.sub("", line.rstrip("\n"), count=1), count=1)


def rank_of(line: str) -> int | None:
    found = _PREFIX.match(line)
    return int(found.group("rank")) if found else None


class OnceFilter:
    """Decides, line by line, what of the ranks' stderr reaches the console (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._printed: OrderedDict[str, list[int]] = OrderedDict()
        """Texts of the lines printed (the last ``REMEMBERED``) -> the ranks that printed them."""
        self._in_error: set[int | None] = set()
        """Ranks between an ``error:`` line and its ``hint:``: the indented lines between are the message's."""

    def show(self, line: str) -> bool:
        """Whether ``line`` goes to the console; remembers it either way."""
        text, rank = text_of(line), rank_of(line)
        with self._lock:
            if text.startswith("error: "):
                self._in_error.add(rank)
            once = text.startswith(ONCE_STARTS) or (rank in self._in_error and text[:1].isspace())
            if text.startswith("hint: ") or not once:
                self._in_error.discard(rank)
            ranks = self._printed.get(text)
            repeat = ranks is not None and rank not in ranks and once
            if ranks is None:
                ranks = self._printed[text] = []
                if len(self._printed) > REMEMBERED:
                    self._printed.popitem(last=False)
            if rank is not None and rank not in ranks:
                ranks.append(rank)
            return not repeat

    def printed(self, text: str) -> bool:
        """Whether a line with this text (prefixes aside) reached the console."""
        with self._lock:
            return text_of(text) in self._printed

    def ranks(self, text: str) -> list[int]:
        """The ranks that printed a line with this text."""
        with self._lock:
            return sorted(self._printed.get(text_of(text), ()))
