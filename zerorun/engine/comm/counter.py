"""Per-kind totals of the engine's collectives: calls, bytes, elements (ZeRO's counting convention,
:mod:`zerorun.engine.comm.collectives`), and which path carried each kind."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


@dataclass
class KindCount:
    calls: int = 0
    bytes: int = 0
    elements: int = 0


@dataclass
class CommCounter:
    """Per-kind totals since the engine started."""

    counts: dict[str, KindCount] = field(default_factory=lambda: {k: KindCount() for k in KINDS})
    via: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, tensor: torch.Tensor) -> None:
        c = self.counts[kind]
        c.calls += 1
        c.elements += tensor.numel()
        c.bytes += tensor.numel() * tensor.element_size()

    def snapshot(self) -> dict[str, dict[str, int | str]]:
        out: dict[str, dict[str, int | str]] = {}
        for kind, c in self.counts.items():
            row: dict[str, int | str] = {"calls": c.calls, "bytes": c.bytes, "elements": c.elements}
            if kind in self.via:
                row["via"] = self.via[kind]
            out[kind] = row
        return out
