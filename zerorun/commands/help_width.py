"""Help that never cuts an option's name: rich's panels where they fit, click's plain list where not.

Rich lays out an options panel as a table that shrinks every column to the terminal's
width, so at 80 columns ``zerorun estimate --help`` showed ``--offload-optim…``: an
option the reader cannot type. The panel is rendered into a capture first; when an
option's name is missing from it, the help is click's plain list instead, which wraps
the descriptions and keeps every name whole at any width.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from typer.core import TyperCommand

from zerorun.width import output_width, unwrap

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextmanager
def _captured_consoles() -> Iterator[list[Any]]:
    """Every console typer's rich help makes while this is open writes into a capture."""
    from typer import rich_utils

    made: list[Any] = []
    original: Callable[..., Any] = rich_utils._get_rich_console

    def capturing(*args: Any, **kwargs: Any) -> Any:
        console = original(*args, **kwargs)
        console.width = output_width(console.file)  # off a terminal: 100 columns, not rich's 80
        console.begin_capture()
        made.append(console)
        return console

    rich_utils._get_rich_console = capturing
    try:
        yield made
    finally:
        rich_utils._get_rich_console = original


def _names(command: TyperCommand) -> list[str]:
    """What a reader must be able to copy from the help: each option's spellings."""
    return [name for param in command.params for name in (*param.opts, *param.secondary_opts) if name.startswith("-")]


class WholeOptionsCommand(TyperCommand):
    """A typer command whose ``--help`` keeps every option's name whole at the terminal's width
    (100 columns off a terminal), its docstring's paragraphs wrapped once."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        written, self.help = self.help, unwrap(self.help or "")  # rich keeps a docstring's line breaks: wrap once
        try:
            self._format_help(ctx, formatter)
        finally:
            self.help = written

    def _format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.width = max(output_width() - 2, 50)
        if self.rich_markup_mode is None:
            super().format_help(ctx, formatter)
            return
        with _captured_consoles() as consoles:
            super().format_help(ctx, formatter)
        rendered = "".join(console.end_capture() for console in consoles)
        plain = _ANSI.sub("", rendered)
        if all(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", plain) for name in _names(self)):
            formatter.write(rendered)
            return
        mode, self.rich_markup_mode = self.rich_markup_mode, None
        try:
            super().format_help(ctx, formatter)
        finally:
            self.rich_markup_mode = mode
        formatter.buffer[:] = [chunk.replace("\\[", "[") for chunk in formatter.buffer]
