"""The width every help text and table is laid out for: the terminal's, else 100 columns.

Off a terminal (a pipe, a log file, CI) tools default to 80 columns, which cut tables
(`autotune`'s ``status`` column read ``statu``) and broke help a second time. ``COLUMNS``
wins when set, as everywhere; a terminal gives its own width; anything else gets 100.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TextIO

OFF_TERMINAL = 100


def output_width(stream: TextIO | None = None) -> int:
    """Columns to lay out for on ``stream`` (default stdout)."""
    text = os.environ.get("COLUMNS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return shutil.get_terminal_size((OFF_TERMINAL, 24)).columns
    except (AttributeError, ValueError, OSError):
        pass
    return OFF_TERMINAL


def unwrap(text: str) -> str:
    """Join the hard line breaks inside each paragraph of a docstring, so a renderer wraps it once.

    Paragraphs are separated by a blank line; a line that starts with whitespace, ``-`` or
    ``*`` (an example, a list item) keeps its own line."""
    out = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        joined = [lines[0]]
        for line in lines[1:]:
            if line[:1].isspace() or line.lstrip().startswith(("-", "*", "\b")) or joined[-1].startswith("\b"):
                joined.append(line)
            else:
                joined[-1] = joined[-1].rstrip() + " " + line.strip()
        out.append("\n".join(joined))
    return "\n\n".join(out)
