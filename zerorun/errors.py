"""User-facing errors: a message and a hint, shown once by the CLI's error boundary."""

from __future__ import annotations


class ZerorunError(Exception):
    """An error the user can fix. ``hint`` says how; the CLI prints both and exits ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message}\nhint: {self.hint}"


class UsageError(ZerorunError):
    """The command line itself is wrong (unknown option, missing argument, bad choice): exit 2.

    ``usage`` is the command's one-line usage, printed above the error as every
    command-line tool does; the hint points at the command's ``--help``.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, usage: str | None = None) -> None:
        super().__init__(message, hint)
        self.usage = usage

