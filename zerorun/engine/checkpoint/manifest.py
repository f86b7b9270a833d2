"""The checkpoint manifest: pure data describing what every rank file holds.

One manifest per tag (``manifest.json``, human-readable). It records the world size,
the ZeRO stage, the compute dtype, the zerorun version and, per bucket, the parameter
names, shapes and offsets inside the bucket's padded flat layout. Rank ``r``'s file
holds chunk ``r`` (``padded_numel / world_size`` elements) of every bucket's fp32 master
and of each optimizer-state tensor, whatever the stage (at stage 0 every rank owns the
whole bucket, but each still writes only its chunk, so the bytes on disk never repeat).
Those ranges are all a loader needs to reshard to any world size (see ``reshard``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = "zerorun-checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
EXTRA = "extra.pt"  # buffers and frozen parameters (rank 0 writes it)


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


def client_file(rank: int) -> str:
    """Rank ``rank``'s ``client_state``: a file of its own, so the model state always loads as data and only
    this file (whatever the script passed) may need ``trust_checkpoint``."""
    return f"client_state_{rank:05d}.pt"


@dataclass(frozen=True)
class ParamEntry:
    """One parameter inside its bucket: ``numel`` elements from ``offset`` of the flat layout."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class BucketEntry:
    group_index: int
    padded_numel: int
    params: tuple[ParamEntry, ...]

    def chunk_numel(self, world_size: int) -> int:
        return self.padded_numel // world_size


@dataclass(frozen=True)
class Manifest:
    world_size: int
    stage: int
    dtype: str
    zerorun_version: str
    buckets: tuple[BucketEntry, ...]
    global_steps: int = 0
    aliases: dict[str, str] = field(default_factory=dict)  # tied name -> the name stored
    optimizer: str = ""
    frozen: list[str] = field(default_factory=list)  # names in extra.pt that are (frozen) parameters, not buffers
    format: str = FORMAT

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {p.name: p.shape for b in self.buckets for p in b.params}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> Manifest:
        raw: dict[str, Any] = json.loads(text)
        buckets = tuple(
            BucketEntry(b["group_index"], b["padded_numel"],
                        tuple(ParamEntry(p["name"], tuple(p["shape"]), p["offset"], p["numel"])
                              for p in b["params"]))
            for b in raw.pop("buckets"))
        return Manifest(buckets=buckets, **raw)


def layout_differences(saved: dict[str, tuple[int, ...]], model: dict[str, tuple[int, ...]],
                       limit: int = 5) -> list[str]:
    """The first ``limit`` differences between two name -> shape maps, worded for an error message."""
    out: list[str] = []
    for name, shape in saved.items():
        if name not in model:
            out.append(f"{name} {list(shape)} is in the checkpoint but not in the model")
        elif tuple(model[name]) != tuple(shape):
            out.append(f"{name}: checkpoint shape {list(shape)}, model shape {list(model[name])}")
    out.extend(f"{name} {list(shape)} is in the model but not in the checkpoint"
               for name, shape in model.items() if name not in saved)
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])
