"""Where each value of a resolved config came from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Source(Enum):
    """The origin of one resolved value."""

    FILE = "file"
    """Written in the config (file or dict) under its current name."""
    DEFAULT = "default"
    """Not written; the schema default."""
    AUTO = "auto"
    """Written as "auto" and resolved (or left at the default until run time)."""
    DERIVED = "derived"
    """Computed from other values (the batch triple, overlap_comm from the stage)."""
    ALIAS = "deprecated alias"
    """Written under an old name and moved to the current key."""


@dataclass(frozen=True)
class Origin:
    source: Source
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.source.value} ({self.detail})" if self.detail else self.source.value


def _renamed_from(path: str, renamed: dict[str, str]) -> str | None:
    """The old name of ``path`` or of the block containing it (``bfloat16`` for ``bf16.enabled``)."""
    for new, old in renamed.items():
        if path == new or path.startswith(f"{new}."):
            return old
    return None


def trace(
    resolved: dict[str, Any],
    given: frozenset[str],
    renamed: dict[str, str],
    auto: dict[str, str],
    derived: dict[str, str],
) -> dict[str, Origin]:
    """An ``Origin`` for every leaf path of ``resolved`` (a flattened, dumped config)."""
    origins: dict[str, Origin] = {}
    for path in resolved:
        if path in derived:
            origins[path] = Origin(Source.DERIVED, derived[path])
        elif path in auto:
            origins[path] = Origin(Source.AUTO, auto[path])
        elif (old := _renamed_from(path, renamed)) is not None:
            origins[path] = Origin(Source.ALIAS, f"from {old}")
        elif path in given:
            origins[path] = Origin(Source.FILE)
        else:
            origins[path] = Origin(Source.DEFAULT)
    return origins
