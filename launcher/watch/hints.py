"""The fix for a failure the launcher recognises in a rank's last stderr lines."""

from __future__ import annotations

from collections.abc import Sequence

HINTS: tuple[tuple[str, str], ...] = (
    ("No module named 'deepspeed'",
     "the script imports deepspeed, which is not installed here: relaunch with `zerorun --as_deepspeed ...` "
     "and zerorun stands in for it (no script edit)"),
)
"""``(text in the stderr tail, the hint)``, first match wins."""


def hint_for(tail: Sequence[str]) -> str | None:
    for needle, hint in HINTS:
        if any(needle in line for line in tail):
            return hint
    return None
