"""The line protocol between the launcher and its agents.

Agents write events on stdout as one line ``MARKER {json}``; the launcher strips
them from the console. The launcher writes commands on the agent's stdin, one per
line; EOF on stdin means the launcher (or its ssh connection) is gone.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

MARKER = "@@zerorun-agent@@ "


class Command(str, Enum):
    """What the launcher can ask an agent to do."""

    STOP = "stop"
    """SIGTERM every rank, SIGKILL after the grace period."""
    INT = "int"
    """Forward SIGINT (Ctrl-C) to every rank."""
    KILL = "kill"
    """SIGKILL every rank now."""


def encode_event(kind: str, **fields: Any) -> str:
    return MARKER + json.dumps({"event": kind, **fields}) + "\n"


def decode_event(line: str) -> dict[str, Any] | None:
    """The event in ``line`` (a pdsh/ssh prefix before the marker is allowed), else None."""
    idx = line.find(MARKER)
    if idx < 0:
        return None
    try:
        event = json.loads(line[idx + len(MARKER) :])
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None
