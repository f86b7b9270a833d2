"""The channel between the launcher and its agents (and the srun/mpirun shims).

Launcher -> agent: one command per line on the agent's stdin (:class:`Command`); EOF
means the launcher (or its ssh connection) is gone.

Agent -> launcher: one event per line on the agent's stdout, in the form::

    @@zerorun-agent@@ KEY {"event": KIND, ...fields}

Contract (what keeps rank output from forging an event):

* ``KEY`` is a secret the launcher makes afresh for every attempt (:func:`new_key`).
  It reaches an agent only inside the plan (on the agent's stdin, or in the owner-only
  plan file pdsh uses, deleted before any rank starts) and a shim only in
  ``ZERORUN_CHANNEL_KEY``, which the shim removes before it starts the rank. No rank
  ever sees it: not in its env, argv or files. A line without the key is a rank's
  text and is shown as text, marker and all.
* Agents write events only at the start of a line; every line of a rank's output
  reaches the launcher behind the agent's ``[host:rank]`` prefix. Only srun/mpirun
  may add a label of their own before the event (``--label``, ``--tag-output``), so
  for them the key is looked for anywhere in the line (:func:`decode_event`).
* Every field of an event is checked against :data:`EVENTS` (type, range, size).
  A line that carries the key but fails the check is a malformed event: the
  launcher logs it (``zerorun: ignored ...``) and carries on; it never raises.
  Semantic checks the launcher alone can make (the node an event names is the node
  that sent it; ``pids`` are children of the agent this launcher started) are the
  executor's.

Adding an event kind (e.g. ``heartbeat``) is three steps: an entry in :data:`EVENTS`
naming its fields, e.g. ``"heartbeat": {"node_rank": NODE, "rank": RANK,
"payload": Field(dict, check=small_json)}``; the sender calls
``encode_event(key, "heartbeat", ...)``; the launcher subscribes a handler with
``Executor.on("heartbeat", fn)`` (``fn(run, event)``, ``event.fields`` already
checked). Unknown kinds are logged and ignored, so an older launcher survives a
newer agent.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

MARKER = "@@zerorun-agent@@ "
KEY_ENV = "ZERORUN_CHANNEL_KEY"
"""The shim's copy of the key (srun/mpirun carry only env); removed before the rank starts."""
MAX_TEXT = 4096
"""Longest string field; a stderr tail line is cut to this."""
MAX_ITEMS = 4096
"""Most items in a list or dict field (pids of one node, stderr tail lines, payload keys)."""


class Command(str, Enum):
    """What the launcher can ask an agent to do."""

    STOP = "stop"
    """SIGTERM every rank, SIGKILL after the grace period."""
    INT = "int"
    """Forward SIGINT (Ctrl-C) to every rank."""
    KILL = "kill"
    """SIGKILL every rank now."""
    STACKS = "stacks"
    """Dump every rank's Python stacks (answered by ``stacks`` events; see launcher.watch.heartbeat_relay)."""


def new_key() -> str:
    """A fresh channel key: 128 random bits as hex."""
    return secrets.token_hex(16)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def nonneg_int(v: Any) -> bool:
    return _is_int(v) and 0 <= v < 2**31


def text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def text_list(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= MAX_ITEMS and all(text(x) for x in v)


def pid_map(v: Any) -> bool:
    """``{"<rank>": pid, ...}``: decimal rank keys, pids > 1."""
    return (isinstance(v, dict) and len(v) <= MAX_ITEMS
            and all(isinstance(k, str) and k.isdigit() and len(k) < 10 and _is_int(p) and 1 < p < 2**31
                    for k, p in v.items()))


def small_json(v: Any, depth: int = 0) -> bool:
    """A dict of JSON scalars, lists and dicts, at most 4 levels deep and MAX_ITEMS wide."""
    if isinstance(v, dict):
        return depth < 4 and len(v) <= MAX_ITEMS and all(
            isinstance(k, str) and len(k) <= 256 and small_json(x, depth + 1) for k, x in v.items())
    if isinstance(v, list):
        return depth < 4 and len(v) <= MAX_ITEMS and all(small_json(x, depth + 1) for x in v)
    if isinstance(v, float):
        return math.isfinite(v)
    return v is None or isinstance(v, bool | int) or text(v)


def timestamp(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def exit_code(v: Any) -> bool:
    return _is_int(v) and 0 <= v <= 255


@dataclass(frozen=True)
class Field:
    """One field of an event: a check of its value, and whether it may be absent or null."""

    check: Callable[[Any], bool]
    optional: bool = False
    what: str = ""
    """What the value must be, for the log line of a malformed event."""


NODE = Field(nonneg_int, what="a node rank")
RANK = Field(nonneg_int, what="a rank")
HOST = Field(text, what="a host name")

EVENTS: dict[str, dict[str, Field]] = {
    "started": {"node_rank": NODE, "host": HOST, "pids": Field(pid_map, what='{"rank": pid}')},
    "failed": {
        "node_rank": NODE, "host": HOST, "rank": RANK, "local_rank": RANK,
        "exit_code": Field(exit_code, what="0-255"), "signal": Field(text, optional=True, what="a signal name"),
        "pid": Field(nonneg_int, optional=True, what="a pid"), "time": Field(timestamp, what="a time"),
        "stderr_tail": Field(text_list, what="a list of lines"), "log_path": Field(text, optional=True, what="a path"),
    },
    "exited": {"node_rank": NODE, "host": HOST, "exit_code": Field(exit_code, what="0-255"),
               "reason": Field(text, optional=True, what="text")},
    # a rank's heartbeat, its fields already checked by its agent (launcher.watch.heartbeat_relay)
    "heartbeat": {"node_rank": NODE, "rank": RANK, "beat": Field(small_json, what="a heartbeat object")},
    "stacks": {"node_rank": NODE, "rank": RANK, "lines": Field(text_list, what="a list of lines")},
    "rank_exited": {"node_rank": NODE, "rank": RANK, "exit_code": Field(exit_code, what="0-255")},
}
"""Every event kind and its fields. Fields not listed are refused: a sender and a
receiver of different versions then say so instead of half-agreeing."""


@dataclass(frozen=True)
class Event:
    """A checked event: ``kind`` is a key of :data:`EVENTS`, ``fields`` passed its checks."""

    kind: str
    fields: Mapping[str, Any]

    def get(self, name: str, default: Any = None) -> Any:
        v = self.fields.get(name)
        return default if v is None else v


class BadEvent(ValueError):
    """A line with the key whose content is not a valid event (logged, never raised past the executor)."""


def encode_event(key: str, kind: str, **fields: Any) -> str:
    return f"{MARKER}{key} {json.dumps({'event': kind, **fields})}\n"


def validate(data: Any) -> Event:
    """``data`` (decoded JSON) as an :class:`Event`, or :class:`BadEvent` saying what is wrong."""
    if not isinstance(data, dict):
        raise BadEvent(f"not a JSON object: {type(data).__name__}")
    kind = data.get("event")
    if not isinstance(kind, str) or kind not in EVENTS:
        raise BadEvent(f"unknown event kind {str(kind)[:64]!r}")
    schema = EVENTS[kind]
    extra = sorted(set(data) - set(schema) - {"event"})
    if extra:
        raise BadEvent(f"{kind}: unexpected field(s) {', '.join(x[:64] for x in extra[:5])}")
    for name, spec in schema.items():
        value = data.get(name)
        if value is None and spec.optional:
            continue
        if value is None or not spec.check(value):
            raise BadEvent(f"{kind}: field {name!r} must be {spec.what or 'valid'}, got {str(value)[:64]!r}")
    return Event(kind, {k: v for k, v in data.items() if k != "event"})


def decode_event(line: str, key: str, anywhere: bool = False) -> Event | None:
    """The event in ``line`` if it carries ``key`` (at the line's start, or ``anywhere``), else None.

    Raises :class:`BadEvent` for a keyed line that is not a valid event.
    """
    tag = f"{MARKER}{key} "
    if not key:
        return None
    idx = 0 if line.startswith(tag) else (line.find(tag) if anywhere else -1)
    if idx < 0:
        return None
    try:
        data = json.loads(line[idx + len(tag):])
    except (json.JSONDecodeError, RecursionError) as e:
        raise BadEvent(f"not JSON: {e}") from None
    return validate(data)


def drop_key(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the channel key (what a rank may inherit)."""
    return {k: v for k, v in env.items() if k != KEY_ENV}
