"""The CLI's error boundary: how a usage error or a user error is shown, in text or JSON.

One format for every command, whichever parser read the command line (typer's click
for the tools, argparse for launch and autotune) and whichever click typer ships.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType
from typing import Any

from zerorun.errors import UsageError, ZerorunError


def click_module() -> ModuleType:
    """The click that typer runs on: its own copy (``typer._click``, typer >= 0.29) or click."""
    try:
        from typer import _click as click  # type: ignore[attr-defined]
    except ImportError:
        import click  # typer < 0.29 depends on click itself
    return click


def _usage_line(ctx: Any) -> str | None:
    if ctx is None:
        return None
    text = ctx.get_usage().strip()
    return text.split(":", 1)[1].strip() if text.lower().startswith("usage:") else text


def from_click(err: Exception) -> ZerorunError | None:
    """A click exception as ours; None for "no arguments: show the help" (printed here)."""
    ctx = getattr(err, "ctx", None)
    if type(err).__name__ == "NoArgsIsHelpError":
        print(ctx.get_help() if ctx is not None else "zerorun --help")
        return None
    message = err.format_message() if hasattr(err, "format_message") else str(err)
    message = " ".join(message.split())  # one line: click wraps long messages
    if type(err).__name__ in ("UsageError", "NoSuchOption", "BadParameter", "MissingParameter",
                              "BadOptionUsage", "BadArgumentUsage") or getattr(err, "exit_code", 1) == 2:
        name = ctx.command_path if ctx is not None else "zerorun"
        return UsageError(message, hint=f"`{name} --help` lists every option", usage=_usage_line(ctx))
    return ZerorunError(message)


def error_json(err: ZerorunError) -> dict[str, Any]:
    """The error as data: ``{"error", "hint", "exit_code"}`` (and ``problems`` of a config)."""
    data: dict[str, Any] = {"error": err.message.splitlines()[0], "hint": err.hint, "exit_code": err.exit_code}
    problems = getattr(err, "problems", None)
    if problems is not None:
        origin = getattr(err, "origin", "")
        data["problems"] = [problem.render(origin) for problem in problems]
    elif len(err.message.splitlines()) > 1:
        data["detail"] = err.message.splitlines()[1:]
    if isinstance(err, UsageError) and err.usage:
        data["usage"] = err.usage
    return data


def print_error(err: ZerorunError, *, as_json: bool = False) -> None:
    """``usage:`` (usage errors), ``error:`` and ``hint:`` on stderr; or one JSON object on stdout."""
    if as_json:
        print(json.dumps(error_json(err), indent=2), flush=True)
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True, highlight=False)
    if isinstance(err, UsageError) and err.usage:
        console.print(f"usage: {escape(err.usage)}", markup=True, soft_wrap=True)
    # escape: messages carry brackets of their own ("[rank 0]", "pip install 'zerorun[plot]'")
    console.print(f"[bold red]error:[/] {escape(err.message)}", markup=True, soft_wrap=True)
    if err.hint:
        console.print(f"[bold cyan]hint:[/] {escape(err.hint)}", markup=True, soft_wrap=True)
    if os.environ.get("ZERORUN_DEBUG"):
        import traceback

        traceback.print_exception(err, file=sys.stderr)
