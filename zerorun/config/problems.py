"""Problems found in a config, and the one error that reports all of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from zerorun.errors import ZerorunError


class Severity(Enum):
    """How bad a problem is."""

    ERROR = "error"
    """The config cannot be used; loading raises ``ConfigError``."""
    WARNING = "warning"
    """The config loads, but something in it is probably not what the author meant."""
    NOTE = "note"
    """Information, e.g. an "auto" value that is resolved only at run time."""


@dataclass(frozen=True)
class Problem:
    """One finding at one key path (``""`` for the file as a whole)."""

    path: str
    message: str
    suggestion: str | None = None
    severity: Severity = Severity.ERROR

    def render(self, origin: str) -> str:
        """``origin: key.path: message (did you mean X?)``."""
        where = f"{origin}: {self.path}: " if self.path else f"{origin}: "
        tail = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"{where}{self.message}{tail}"


class ConfigWarning(UserWarning):
    """A config warning (deprecated key, a key with no effect ...), issued by ``load_config``."""


DEFAULT_HINT = (
    "fix the keys listed above; `zerorun print-config --template zero2` prints a valid config "
    "with every key and its default"
)


class ConfigError(ZerorunError, ValueError):
    """The config has one or more errors; ``problems`` lists every one of them.

    Also a ``ValueError``: DeepSpeed raises that for a bad config, and code written against it catches it.
    """

    def __init__(
        self,
        origin: str,
        problems: Sequence[Problem],
        *,
        warnings: Sequence[Problem] = (),
        hint: str | None = None,
    ) -> None:
        self.origin = origin
        self.problems = tuple(problems)
        self.warnings = tuple(warnings)
        count = len(self.problems)
        head = f"{origin}: {count} problem{'s' if count != 1 else ''} in the config:"
        lines = "\n".join(f"  {problem.render(origin)}" for problem in self.problems)
        super().__init__(f"{head}\n{lines}", hint=hint or DEFAULT_HINT)

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), self.origin, self.problems, self.warnings, self.hint)


def _rebuilt(cls: type[ConfigError], origin: str, problems: Sequence[Problem], warnings: Sequence[Problem],
             hint: str | None) -> ConfigError:
    return cls(origin, problems, warnings=warnings, hint=hint)
