"""The fix for a failure the launcher recognises in a rank's last stderr lines."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HINTS: tuple[tuple[str, str], ...] = (
    ("No module named 'deepspeed'",
     "the script imports deepspeed, which is not installed here: relaunch with `zerorun --as_deepspeed ...` "
     "and zerorun stands in for it (no script edit)"),
)
"""``(text in the stderr tail, the hint)``, first match wins."""

Hint = Callable[[Sequence[str]], "str | None"]
"""A launch's own hint: the fix for its tail, or None (see :class:`MisplacedOptions`)."""

UNRECOGNIZED = "unrecognized arguments:"


@dataclass(frozen=True)
class MisplacedOptions:
    """Launcher options written after the script: the script got them (everything after the
    script is the script's, as with DeepSpeed's launcher), and a script whose argparse does
    not know them fails with ``unrecognized arguments: --num_gpus 2``. Only then is it the
    launcher's business: a script that takes ``--num_gpus`` itself is never second-guessed."""

    head: tuple[str, ...]
    """The launcher's options and the script, as given."""
    args: tuple[str, ...]
    """The script's arguments, as given."""
    spans: tuple[tuple[str, int, int], ...]
    """``(flag, start, stop)``: the launcher's flags among ``args`` (with their values), as written."""

    def fixed(self, flags: set[str]) -> str:
        """The command line with ``flags`` (and their values) moved before the script."""
        moved = [i for flag, start, stop in self.spans if flag in flags for i in range(start, stop)]
        rest = [a for i, a in enumerate(self.args) if i not in moved]
        return shlex.join(["zerorun", *self.head[:-1], *(self.args[i] for i in moved), self.head[-1], *rest])

    def __call__(self, tail: Sequence[str]) -> str | None:
        for line in tail:
            _, found, rest = line.partition(UNRECOGNIZED)
            named = {token.split("=", 1)[0] for token in rest.split()} & {flag for flag, _, _ in self.spans}
            if found and named:
                return (f"{', '.join(sorted(named))} went to the script (everything after the script is the "
                        f"script's); launcher options go before it: {self.fixed(named)}")
        return None


def hint_for(tail: Sequence[str], own: Sequence[Hint] = ()) -> str | None:
    for hint in own:
        said = hint(tail)
        if said:
            return said
    for needle, text in HINTS:
        if any(needle in line for line in tail):
            return text
    return None
