"""`zerorun validate FILE`: check a config before any rank starts."""

from __future__ import annotations

from zerorun.errors import ZerorunError


def command() -> None:
    """Validate a DeepSpeed-style config file."""
    raise ZerorunError("`zerorun validate` is not built yet")
