"""Writing a resolved config out: JSON, YAML, or rows of (key, value, source, description)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from zerorun.config import keys
from zerorun.config.load import LoadedConfig


def to_data(loaded: LoadedConfig) -> dict[str, Any]:
    """The resolved config as plain data, every key present (round-trips through load_config)."""
    return loaded.config.model_dump(mode="json")


def to_json(loaded: LoadedConfig) -> str:
    return json.dumps(to_data(loaded), indent=2) + "\n"


def to_yaml(loaded: LoadedConfig) -> str:
    return yaml.safe_dump(to_data(loaded), sort_keys=False, default_flow_style=False)


@dataclass(frozen=True)
class Row:
    """One leaf of the resolved config, for the table view."""

    key: str
    value: str
    source: str
    description: str


def _format(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int) and abs(value) >= 10_000_000 and value % 1_000_000 == 0:
        return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def rows(loaded: LoadedConfig) -> list[Row]:
    """Every leaf in schema order with its value, where it came from, and its meaning."""
    flat = keys.leaves(loaded.config.model_dump(mode="json"))
    return [
        Row(path, _format(value), str(loaded.provenance.get(path, "")), keys.description(path))
        for path, value in flat.items()
    ]
