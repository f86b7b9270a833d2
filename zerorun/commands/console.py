"""The rich console every command prints through: the terminal's width, else 100 columns (zerorun.width)."""

from __future__ import annotations

import sys

from rich.console import Console

from zerorun.width import output_width


def console(stderr: bool = False) -> Console:
    """A console for stdout (or stderr) that lays tables out once, for the width the reader has."""
    return Console(stderr=stderr, highlight=False, width=output_width(sys.stderr if stderr else sys.stdout))
