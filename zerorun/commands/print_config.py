"""`zerorun print-config FILE`: the fully resolved config."""

from __future__ import annotations

from zerorun.errors import ZerorunError


def command() -> None:
    """Print the fully resolved config."""
    raise ZerorunError("`zerorun print-config` is not built yet")
