"""The tree of config keys, read off the schema: paths, blocks, descriptions, defaults."""

from __future__ import annotations

import types
import typing
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from zerorun.config.schema import ZerorunConfig

FREE_FORM = ("optimizer.params", "scheduler.params")
"""Keys whose value is a free mapping (an optimizer's kwargs), treated as one leaf."""


def block_type(annotation: Any) -> type[BaseModel] | None:
    """The model class inside ``annotation`` (``X``, ``X | None``), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = block_type(arg)
            if found is not None:
                return found
    return None


@cache
def fields() -> dict[str, FieldInfo]:
    """Every key path (blocks and leaves) -> its pydantic field, in schema order."""
    found: dict[str, FieldInfo] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            path = f"{prefix}{name}"
            found[path] = info
            inner = block_type(info.annotation)
            if inner is not None:
                walk(inner, f"{path}.")

    walk(ZerorunConfig, "")
    return found


def is_block(path: str) -> bool:
    """True when ``path`` names a block of keys (``zero_optimization``), not a value."""
    info = fields().get(path)
    return info is not None and block_type(info.annotation) is not None


def children(path: str) -> list[str]:
    """The key names directly inside the block at ``path`` (``""`` for the top level)."""
    prefix = f"{path}." if path else ""
    return [
        key[len(prefix) :] for key in fields() if key.startswith(prefix) and "." not in key[len(prefix) :]
    ]


def description(path: str) -> str:
    """The key's meaning; for a key the engine accepts but never reads, that it has no effect and
    why (config/noop.py, the source the load-time warning and the templates' comments use too)."""
    from zerorun.config.noop import NO_EFFECT

    if path in NO_EFFECT:
        return f"Accepted for DeepSpeed's configs; no effect here: {NO_EFFECT[path]}."
    info = fields().get(path)
    return (info.description or "") if info is not None else ""


def find_elsewhere(name: str) -> list[str]:
    """Full paths of keys named ``name`` anywhere in the tree (for "it belongs in X")."""
    return [path for path in fields() if path.rsplit(".", 1)[-1] == name]


def get(data: dict[str, Any], path: str) -> Any:
    """The value at ``path`` in a nested dict, or ``KeyError``."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def has(data: dict[str, Any], path: str) -> bool:
    try:
        get(data, path)
    except KeyError:
        return False
    return True


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested dict to ``{"a.b": value}``; free-form mappings stay whole."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in FREE_FORM:
            flat.update(leaves(value, f"{path}."))
        else:
            flat[path] = value
    return flat
