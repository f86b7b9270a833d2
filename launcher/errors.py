"""The launcher's user-facing errors; each carries a hint the CLI prints under it."""

from __future__ import annotations

from zerorun.errors import ZerorunError


class LaunchError(ZerorunError):
    """A launch cannot start as asked (bad flag, unknown runner, missing file)."""


class HostfileError(LaunchError):
    """The hostfile is missing or malformed; the message names ``file:line`` and the text."""


class FilterError(LaunchError):
    """``--include``/``--exclude``/``--num_nodes``/``--num_gpus`` select nothing or too much."""


class EnvFileError(LaunchError):
    """An env file (``.zerorun_env``, ``.deepspeed_env``) or ``--env`` item is malformed."""


class PreflightError(LaunchError):
    """A remote host failed the checks run before any rank starts."""
