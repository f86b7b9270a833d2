"""Schema validation that reports every error at once, in the user's words.

pydantic's errors become ``Problem``s with the full key path, a plain message and a
did-you-mean suggestion for unknown keys. The offending values are then removed and
validation is repeated, so that the cross-field rules can still run on a config in
which the broken keys stand at their defaults.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from zerorun.config import keys
from zerorun.config.aliases import RENAMED
from zerorun.config.not_yet import not_yet_message, without_off_values
from zerorun.config.problems import Problem
from zerorun.config.schema import ZerorunConfig
from zerorun.config.suggest import did_you_mean
from zerorun.config.values import show

_MAX_ROUNDS = 8


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _unknown_key(loc: tuple[int | str, ...]) -> Problem:
    refused = not_yet_message(_path(loc))
    if refused is not None:
        return Problem(_path(loc), refused)
    parent, name = _path(loc[:-1]), str(loc[-1])
    siblings = keys.children(parent)
    suggestion = did_you_mean(name, siblings)
    if suggestion is None:
        old = f"{parent}.{name}" if parent else name
        suggestion = RENAMED.get(old)
    if suggestion is None:
        elsewhere = keys.find_elsewhere(name)
        if elsewhere:
            return Problem(
                _path(loc),
                f"unknown key here; it belongs in {elsewhere[0].rsplit('.', 1)[0] or 'the top level'}",
                elsewhere[0],
            )
    elif parent:
        suggestion = f"{parent}.{suggestion}"
    return Problem(_path(loc), "unknown key", suggestion)


def _to_problem(error: ErrorDetails) -> Problem:
    loc, kind, value = error["loc"], error["type"], error.get("input")
    if kind == "extra_forbidden":
        return _unknown_key(loc)
    path = _path(loc)
    if value == "auto":
        return Problem(path, '"auto" cannot be resolved for this key; give a value')
    if kind == "missing":
        return Problem(path, "is required in this block")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return Problem(path, f"expected a block of keys (a mapping), got {show(value)}")
    return Problem(path, error["msg"])


def _remove(data: dict[str, Any], loc: tuple[int | str, ...], kind: str) -> None:
    """Drop the value at ``loc`` (its parent block when the key is required)."""
    info = keys.fields().get(_path(loc))
    if kind == "missing" or (info is not None and info.is_required()):
        loc = loc[:-1]  # a required key cannot fall back to a default: drop its block
    node: Any = data
    for part in loc[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(loc[-1], None)


def validate_schema(data: dict[str, Any]) -> tuple[ZerorunConfig, list[Problem], frozenset[str]]:
    """The config (broken keys at their defaults), the schema problems, and the broken paths."""
    work = copy.deepcopy(without_off_values(data))
    problems: list[Problem] = []
    invalid: set[str] = set()
    for _ in range(_MAX_ROUNDS):
        try:
            return ZerorunConfig.model_validate(work), problems, frozenset(invalid)
        except ValidationError as err:
            for error in err.errors():
                problems.append(_to_problem(error))
                invalid.add(_path(error["loc"]))
                _remove(work, error["loc"], error["type"])
    return ZerorunConfig(), problems, frozenset(invalid | {""})
