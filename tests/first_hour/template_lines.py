"""Each key line of a template as ``(line index, full key path, comment)`` (block-style YAML)."""

from __future__ import annotations

import re

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_0-9]+):(?P<rest>.*)$")


def key_lines(text: str) -> list[tuple[int, str, str]]:
    out, stack = [], []  # stack of (indent, key)
    for i, line in enumerate(text.splitlines()):
        found = _KEY.match(line)
        if not found:
            continue
        indent = len(found.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, found.group("key")))
        rest = found.group("rest")
        comment = rest.split("#", 1)[1].strip() if "#" in rest else ""
        out.append((i, ".".join(k for _, k in stack), comment))
    return out
