"""YAML configs as plain data: duplicate keys refused, merge keys applied, aliases bounded.

PyYAML builds an alias as a second reference to the anchored node, so a 600-byte file of
nested aliases (a "billion laughs") is a few nodes in memory and millions once anything
walks it (validation, printing, a deepcopy), and an anchor used inside itself is a cycle
no walk ends. So the composed node graph is measured before anything is built: every
alias counts as the copy it stands for (memoized, so the measuring is linear in the
file), and a graph past :data:`MAX_NODES` or with a cycle is refused with its line.
Merge keys (``<<: *base``, ``<<: [*a, *b]``) work as YAML 1.1 says: the keys written
beside them win; a key written twice in one mapping is still an error.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_NODES = 100_000  # a DeepSpeed config is under a thousand values; aliases may not multiply it past this
MAX_DEPTH = 100  # a config nests a few levels; PyYAML's scanner slows with the square of the depth


class DuplicateKey(Exception):
    def __init__(self, key: str, line: int | None) -> None:
        super().__init__(key)
        self.key = key
        self.line = line


class Unbounded(Exception):
    """An alias that refers to its own anchor, or aliases that expand past :data:`MAX_NODES`."""

    def __init__(self, message: str, line: int, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.hint = hint


MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, applies merge keys, measures aliases before building and
    reads ``5e8`` as a float."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise Unbounded(f"the YAML nests deeper than {MAX_DEPTH} levels (line {line})", line,
                                "a config nests a few levels; check the file for runaway brackets")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self) -> yaml.Node:
        self.get_event()  # the document's start
        node = self.compose_node(None, None)
        self.get_event()  # its end
        measure(node, {id(n): name for name, n in self.anchors.items()})
        self.anchors = {}
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: PyYAML's own construction names it below
                continue
            if duplicate:
                raise DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # flattens the merge keys first


# ``5e8`` (no dot) reads as the number DeepSpeed users mean, not YAML 1.1's string
_SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _SCIENTIFIC, list("-+0123456789"))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def measure(root: yaml.Node, anchors: dict[int, str]) -> int:
    """The number of values ``root`` stands for with every alias expanded; raises :class:`Unbounded`."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        line = node.start_mark.line + 1
        if key in open_nodes:
            name = anchors.get(key, "?")
            raise Unbounded(f"the anchor &{name} (line {line}) is used inside itself: the value would be infinite",
                            line, f"an alias *{name} may only follow the end of its anchor's value")
        open_nodes.add(key)
        total = 1
        for child in _children(node):
            total += size(child)
            if total > MAX_NODES:
                raise Unbounded(f"the aliases expand to more than {MAX_NODES:,} values (from line {line}), "
                                "far more than any config holds", line,
                                "write the values out, or nest fewer aliases of aliases")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)
