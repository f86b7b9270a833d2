"""`zerorun report`: the environment report."""

from __future__ import annotations

from zerorun.errors import ZerorunError


def command() -> None:
    """Report the environment."""
    raise ZerorunError("`zerorun report` is not built yet")
