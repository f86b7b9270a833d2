"""The argparse parser of the launcher and of autotune, in zerorun's one flag language.

* Every long flag works in both spellings, ``--num_gpus`` and ``--num-gpus``: the
  alternate spelling of each flag is registered when the parser is used, so a flag
  added to the parser later gets it too (no list to keep up to date).
* A usage error raises ``UsageError`` (printed by the CLI's error boundary as the
  usage and one ``error:`` line, exit 2) instead of argparse's own print-and-exit.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from zerorun.config.suggest import did_you_mean
from zerorun.errors import UsageError
from zerorun.width import output_width, unwrap


def spellings(flag: str) -> set[str]:
    """``--num_gpus`` -> ``{--num_gpus, --num-gpus}``; short flags have one spelling."""
    if not flag.startswith("--"):
        return {flag}
    body = flag[2:]
    return {flag, "--" + body.replace("_", "-"), "--" + body.replace("-", "_")}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help laid out once, for the terminal's width or 100 columns off one
    (zerorun.width): the description's paragraphs wrap, the examples' lines stay as written."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or output_width() - 2)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return "\n".join(line if line[:1].isspace() or not line else
                         textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
                         for line in unwrap(text).splitlines())


class LauncherParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with both spellings of every long flag and ``UsageError``."""

    def both_spellings(self) -> None:
        """Register each long flag's other spelling (idempotent; flags added later included)."""
        for action in self._actions:
            for flag in list(action.option_strings):
                for alt in spellings(flag):
                    self._option_string_actions.setdefault(alt, action)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.both_spellings()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:  # argparse calls this for every usage error
        hint = f"`{self.prog}{' launch' if self.prog == 'zerorun' else ''} --help` lists every option"
        if message.startswith("unrecognized arguments:"):
            first = message.split(":", 1)[1].split()[0].split("=", 1)[0]
            guess = did_you_mean(first, [f for f in self._option_string_actions if f.startswith("--")])
            if guess is not None:
                hint = f"did you mean {guess}? " + hint
        usage = self.format_usage().strip()
        raise UsageError(message, hint=hint, usage=usage.split(":", 1)[1].strip() if ":" in usage else usage)
