"""Reading a config source (a JSON or YAML file, or a dict) into a plain dict.

Duplicate keys are errors (the later value would silently win). A malformed file
is reported with its name, line and column; YAML merge keys work and aliases are bounded
(``yaml_load``). JSON may carry ``//`` and ``/* */``
comments and a UTF-8 byte-order mark, as DeepSpeed (which reads hjson) allows. YAML follows YAML 1.1 as PyYAML does,
except that ``5e8`` (no dot) is read as the number DeepSpeed users mean, not a string.
"""

from __future__ import annotations

import copy
import enum
import json
import os
import re
from pathlib import Path
from typing import Any

import hjson
import yaml

from zerorun.config.problems import ConfigError, Problem
from zerorun.config.yaml_load import DuplicateKey as _DuplicateKey
from zerorun.config.yaml_load import StrictLoader as _StrictLoader
from zerorun.config.yaml_load import Unbounded

DICT_ORIGIN = "<dict>"

def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key, None)
        result[key] = value
    return result


def _line_of_second(text: str, key: str) -> int | None:
    """Best-effort line of the second ``"key":`` in JSON text (json gives no position)."""
    hits = [m.start() for m in re.finditer(rf'"{re.escape(key)}"\s*:', text)]
    return text.count("\n", 0, hits[1]) + 1 if len(hits) > 1 else None


def _malformed(origin: str, line: int | None, column: int | None, message: str, kind: str) -> ConfigError:
    where = f"line {line}, column {column}" if line and column else (f"line {line}" if line else "")
    text = f"malformed {kind}" + (f" at {where}" if where else "") + f": {message}"
    hint = f"fix the {kind} syntax" + (f" at {where}" if where else "")
    return ConfigError(origin, [Problem("", text)], hint=hint)


def strip_json_comments(text: str) -> str:
    """``text`` with ``//`` and ``/* */`` comments outside strings blanked (newlines kept, so
    error positions still point at the right line and column)."""
    out: list[str] = []
    i, n, in_string = 0, len(text), False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif text.startswith("//", i) or text.startswith("#", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _json_or_hjson(text: str) -> Any:
    """JSON; else Hjson (unquoted keys and strings, no commas), which DeepSpeed reads its config files as.

    The JSON error is the one reported when neither parses: it points at the first bad character.
    """
    try:
        return json.loads(strip_json_comments(text), object_pairs_hook=_json_pairs)
    except json.JSONDecodeError:
        try:
            return hjson.loads(text, object_pairs_hook=_json_pairs)
        except hjson.HjsonDecodeError:
            pass
        raise


def parse_text(text: str, origin: str, *, is_json: bool) -> Any:
    """Parse config text; JSON when ``is_json`` else YAML (a superset for our purposes)."""
    try:
        if is_json:
            return _json_or_hjson(text)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as dup:
        line = dup.line or (_line_of_second(text, dup.key) if is_json else None)
        where = f" (line {line})" if line else ""
        problem = Problem("", f"duplicate key {dup.key!r}{where}; the later value would silently win")
        raise ConfigError(origin, [problem], hint=f"keep one {dup.key!r} in that block") from None
    except json.JSONDecodeError as err:
        raise _malformed(origin, err.lineno, err.colno, err.msg, "JSON") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        message = " ".join(part for part in (err.context, err.problem) if part)
        raise _malformed(origin, line, column, message, "YAML") from None
    except yaml.YAMLError as err:
        raise _malformed(origin, None, None, str(err), "YAML") from None
    except Unbounded as err:
        raise ConfigError(origin, [Problem("", err.message)], hint=err.hint) from None
    except RecursionError:
        kind = "JSON" if is_json else "YAML"
        raise ConfigError(origin, [Problem("", f"the {kind} nests too deeply to read")],
                          hint="a config nests a few levels; check the file for runaway brackets") from None


def read_source(source: str | os.PathLike[str] | dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    """The raw config dict and its origin (a file name or ``<dict>``) for messages."""
    if source is None:
        return {}, "<defaults>"
    if isinstance(source, dict):
        data, origin = _plain_values(copy.deepcopy(source)), DICT_ORIGIN
    elif isinstance(source, (str, os.PathLike)):  # any path object (pathlib, py.path, ...)
        data, origin = _read_file(Path(source)), os.fspath(source)
    else:
        raise ConfigError(
            "<config>",
            [Problem("", f"expected a path or a dict, got {type(source).__name__}")],
            hint="pass config='ds_config.json' (or .yaml), or a dict of DeepSpeed keys",
        )
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problem = Problem("", f"the top level must be a mapping of keys, got {type(data).__name__}")
        raise ConfigError(origin, [problem], hint='write the config as {"key": value, ...}')
    bad_keys = [key for key in _all_keys(data) if not isinstance(key, str)]
    if bad_keys:
        problem = Problem("", f"keys must be strings, got {bad_keys[0]!r}")
        raise ConfigError(origin, [problem], hint="quote the key in the file")
    return data, origin


def _plain_values(data: Any) -> Any:
    """A dict config with enum members as values (``{"device": OffloadDeviceEnum.cpu}``, as DeepSpeed's own
    enums are written in Python) holds their values instead, as DeepSpeed's config models read them."""
    if isinstance(data, dict):
        return {k: _plain_values(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain_values(v) for v in data]
    if isinstance(data, enum.Enum) and isinstance(data.value, (str, int, float, bool)):
        return data.value
    return data


def _all_keys(data: dict[Any, Any]) -> list[Any]:
    found = list(data)
    for value in data.values():
        if isinstance(value, dict):
            found.extend(_all_keys(value))
    return found


def _read_file(path: Path) -> Any:
    if not path.is_file():
        problem = Problem("", "no such file" if not path.exists() else "not a regular file")
        raise ConfigError(
            str(path), [problem], hint="check the path (relative paths start at the working directory)"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a leading byte-order mark is dropped
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        problem = Problem("", f"not UTF-8 text: byte 0x{err.object[err.start]:02x} at line {line} cannot be decoded")
        raise ConfigError(str(path), [problem], hint="save the config as UTF-8 (JSON and YAML files are UTF-8)") from None
    is_json = path.suffix.lower() == ".json" or (
        path.suffix.lower() not in (".yaml", ".yml") and strip_json_comments(text).lstrip().startswith("{")
    )
    return parse_text(text, str(path), is_json=is_json)
