"""The ``elasticity`` block: one global batch that works at several world sizes.

DeepSpeed's semantics (``compute_elastic_config``, versions 0.1 and 0.2), reimplemented:

* v0.1 takes candidate batch sizes (each micro batch, and their LCM, scaled by the
  largest highly composite number that keeps it within ``max_train_batch_size``), and
  keeps the one with the most world sizes in ``[min_gpus, max_gpus]`` it divides into
  whole micro batches; ties go to the larger batch (``prefer_larger_batch``) or the smaller.
* v0.2 does the same per node (``num_gpus_per_node``, ``model_parallel_size``); a world
  that is not one of the valid ones gets the largest (or smallest) batch that fits it.

For a given world the micro batch is the largest of ``micro_batch_sizes`` that divides
``batch // world``; gradient accumulation is what is left. Pure arithmetic: no
environment is read (DeepSpeed reads ``WORLD_SIZE`` for v0.2 when no world is given;
here the caller passes it). ``tests/fixtures/elastic_parity.json`` holds DeepSpeed's
own answers over a grid, and ``tests/config/test_elastic.py`` compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

HCN = (1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560, 10080, 15120,
       20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760, 277200, 332640, 498960, 554400,
       665280, 720720)
"""The 38 smallest highly composite numbers: the scale factors (enough for batches up to ~720K)."""

LATEST_VERSION = 0.2
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class ElasticError(ValueError):
    """A bad elasticity block or a world it cannot run at; ``key`` to fix, ``hint`` the fix.

    ``kind`` is DeepSpeed's exception for the same case (``config``: ElasticityConfigError,
    ``world``: ElasticityIncompatibleWorldSize, ``value``: the ValueError/assert it raises).
    """

    def __init__(self, key: str, message: str, hint: str, kind: str = "config") -> None:
        super().__init__(message)
        self.key, self.message, self.hint, self.kind = key, message, hint, kind


@dataclass(frozen=True)
class ElasticSpec:
    """The block's values, checked as DeepSpeed's ``ElasticityConfig`` checks them."""

    max_train_batch_size: int
    micro_batch_sizes: tuple[int, ...]
    min_gpus: int = 1
    max_gpus: int = 10000
    num_gpus_per_node: int = 1
    model_parallel_size: int = 1
    min_time: int = 0
    version: float = LATEST_VERSION
    prefer_larger_batch: bool = True
    ignore_non_elastic_batch_info: bool = False


@dataclass(frozen=True)
class ElasticPlan:
    """The final global batch, the valid world sizes and, for one world, its micro batch and accumulation."""

    train_batch_size: int
    valid_worlds: tuple[int, ...]
    world_size: int | None = None
    micro_batch: int | None = None
    gradient_accumulation_steps: int | None = None


def enabled(block: Any) -> bool:
    """Whether an ``elasticity`` block is on (DeepSpeed: off unless ``enabled: true``)."""
    return isinstance(block, dict) and block.get("enabled", False) is True


def _positive(block: dict[str, Any], key: str, default: int, least: int = 1) -> int:
    value = block.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ElasticError(f"elasticity.{key}", f"elasticity.{key} must be an integer >= {least}, got {value!r}",
                           f"set elasticity.{key} to an integer >= {least}")
    return value


def parse_block(block: dict[str, Any]) -> ElasticSpec:
    """The checked spec of an enabled block, or ``ElasticError`` naming the key."""
    for key in ("max_train_batch_size", "micro_batch_sizes"):
        if key not in block:
            raise ElasticError(f"elasticity.{key}", f"an enabled elasticity block needs {key}",
                               'add e.g. "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6]')
    micro = block["micro_batch_sizes"]
    if not isinstance(micro, list) or not micro or not all(
            isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in micro):
        raise ElasticError("elasticity.micro_batch_sizes",
                           f"elasticity.micro_batch_sizes must be a list of positive integers, got {micro!r}",
                           "write it as a list, e.g. [2, 4, 6]")
    spec = ElasticSpec(
        max_train_batch_size=_positive(block, "max_train_batch_size", 2000),
        micro_batch_sizes=tuple(micro),
        min_gpus=_positive(block, "min_gpus", 1),
        max_gpus=_positive(block, "max_gpus", 10000),
        num_gpus_per_node=_positive(block, "num_gpus_per_node", 1),
        model_parallel_size=_positive(block, "model_parallel_size", 1),
        min_time=_positive(block, "min_time", 0, least=0),
        version=float(block.get("version", LATEST_VERSION)),
        prefer_larger_batch=bool(block.get("prefer_larger_batch", True)),
        ignore_non_elastic_batch_info=bool(block.get("ignore_non_elastic_batch_info", False)),
    )
    if spec.max_gpus < spec.min_gpus:
        raise ElasticError("elasticity.min_gpus", f"min_gpus ({spec.min_gpus}) > max_gpus ({spec.max_gpus})",
                           "make min_gpus <= max_gpus")
    if spec.model_parallel_size > 1 and spec.version != 0.2:
        raise ElasticError("elasticity.model_parallel_size", f"elasticity version {spec.version} has no model "
                           "parallelism", "use version 0.2 or model_parallel_size 1")
    if spec.version not in (0.1, 0.2):
        raise ElasticError("elasticity.version", f"elasticity version {spec.version} is not 0.1 or 0.2",
                           "set version to 0.1 or 0.2")
    return spec


def _candidates(bases: list[int], cap: int) -> list[int]:
    """Each base scaled by the largest HCN that keeps it within ``cap`` (a base above the cap is dropped)."""
    out = set()
    for base in bases:
        if base > cap:
            continue
        if base == cap:
            out.add(base)
            continue
        above = next((i for i, h in enumerate(HCN) if h > cap // base), 0)
        out.add(HCN[above - 1] * base)
    return sorted(out)


def _valid_worlds(batch: int, micro: tuple[int, ...], least: int, most: int) -> list[int]:
    """The worlds in [least, most] at which ``batch`` is a whole number of some micro batch per rank."""
    worlds = set()
    for mb in micro:
        if batch % mb:
            continue
        top = batch // mb
        if least <= top <= most:
            worlds.add(top)
        worlds.update(i for i in range(max(1, least), min(top // 2, most) + 1) if top % i == 0)
    return sorted(worlds)


def _v01(micro: tuple[int, ...], cap: int, least: int, most: int, larger: bool) -> tuple[int, list[int] | None]:
    """The best candidate and its worlds; None when no candidate was ever taken (DeepSpeed then fails on it)."""
    least, most = least or 1, most or cap // min(micro)
    if any(mb > cap for mb in micro):
        raise ElasticError("elasticity.micro_batch_sizes", f"every micro batch must be <= max_train_batch_size "
                           f"({cap}), got {list(micro)}", "drop the larger micro batches", kind="value")
    best, count, worlds = min(micro), 0, None
    for batch in _candidates([*micro, math.lcm(*micro)], cap):
        here = _valid_worlds(batch, micro, least, most)
        if len(here) > count or (len(here) == count and (batch > best if larger else batch < best)):
            best, count, worlds = batch, len(here), here
    return best, worlds


def _micro_for(spec: ElasticSpec, batch: int, world: int) -> int | None:
    """v0.2's pick: the first micro batch dividing ``batch // world``, or the largest with prefer_larger."""
    pick = None
    for mb in spec.micro_batch_sizes:
        if batch // world % mb == 0 and (pick is None or (spec.prefer_larger_batch and mb > pick)):
            pick = mb
    return pick


def _no_world(spec: ElasticSpec) -> ElasticError:
    return ElasticError("elasticity", f"no batch within max_train_batch_size ({spec.max_train_batch_size}) runs at "
                        f"any world in [{spec.min_gpus}, {spec.max_gpus}]",
                        "raise max_train_batch_size or widen min_gpus/max_gpus", kind="value")


def _v02(spec: ElasticSpec, world: int) -> tuple[int, list[int]]:
    if spec.num_gpus_per_node % spec.model_parallel_size:
        raise ElasticError("elasticity.num_gpus_per_node", f"num_gpus_per_node ({spec.num_gpus_per_node}) is not "
                           f"divisible by model_parallel_size ({spec.model_parallel_size})",
                           "make num_gpus_per_node a multiple of model_parallel_size")
    per_node = spec.num_gpus_per_node // spec.model_parallel_size
    batch, nodes = _v01(spec.micro_batch_sizes, int(spec.max_train_batch_size / per_node),
                        int(spec.min_gpus / spec.num_gpus_per_node), int(spec.max_gpus / spec.num_gpus_per_node),
                        spec.prefer_larger_batch)
    if nodes is None:
        raise _no_world(spec)
    batch, dp_worlds = batch * per_node, [n * per_node for n in nodes]
    if world // spec.model_parallel_size in dp_worlds:
        return batch, dp_worlds
    dp = world / spec.num_gpus_per_node * per_node
    sizes = [math.floor(spec.max_train_batch_size / (mb * dp)) * mb * dp for mb in spec.micro_batch_sizes]
    return int(max(sizes) if spec.prefer_larger_batch else min(sizes)), [int(dp)]


def compute(block: dict[str, Any], world_size: int | None = None) -> ElasticPlan:
    """DeepSpeed's ``compute_elastic_config(..., world_size, return_microbatch=True)`` for an enabled block."""
    spec = parse_block(block)
    if spec.version == 0.1:
        batch, worlds = _v01(spec.micro_batch_sizes, spec.max_train_batch_size, spec.min_gpus, spec.max_gpus,
                             spec.prefer_larger_batch)
    elif world_size is None:
        raise ElasticError("elasticity.version", "elasticity version 0.2 needs the world size to compute the batch",
                           "pass the world size (zerorun elastic --world N)")
    else:
        batch, worlds = _v02(spec, world_size)
    if worlds is None and world_size is not None:
        raise _no_world(spec)
    if world_size is None:
        return ElasticPlan(batch, tuple(worlds or ()))
    if world_size not in worlds:
        near = nearest(worlds, world_size)
        raise ElasticError("elasticity", f"world size {world_size} is not one of the elastic config's valid "
                           f"world sizes {worlds}", f"run at {near}" if near else "widen min_gpus/max_gpus",
                           kind="world")
    micro = next((mb for mb in sorted(set(spec.micro_batch_sizes), reverse=True) if batch // world_size % mb == 0),
                 None)
    if micro is None:
        raise ElasticError("elasticity.micro_batch_sizes", f"no micro batch of {list(spec.micro_batch_sizes)} "
                           f"divides {batch} // {world_size}", "add a micro batch that divides it", kind="value")
    return ElasticPlan(batch, tuple(worlds), world_size, micro, batch // (micro * world_size))


def nearest(worlds: list[int] | tuple[int, ...], world: int) -> str:
    """The valid worlds just below and above ``world``, for an error's hint ("2 or 4")."""
    below = [w for w in worlds if w < world]
    above = [w for w in worlds if w > world]
    picks = ([max(below)] if below else []) + ([min(above)] if above else [])
    return " or ".join(str(w) for w in picks)


def kept_batch_worlds(train_batch_size: int, micro_batch: int) -> list[int]:
    """The worlds at which ``train_batch_size`` is a whole number of ``micro_batch`` steps per rank."""
    if train_batch_size % micro_batch:
        return []
    steps = train_batch_size // micro_batch
    return [w for w in range(1, steps + 1) if steps % w == 0]


def keep_global_batch(train_batch_size: int, micro_batch: int, world_size: int) -> int:
    """The accumulation that keeps ``train_batch_size`` at ``world_size`` (a restart without an elasticity block).

    The micro batch stays (so does each micro-step's memory); only the accumulation changes.
    A world it does not divide into is refused, naming the nearest that work.
    """
    worlds = kept_batch_worlds(train_batch_size, micro_batch)
    if world_size not in worlds:
        near = nearest(worlds, world_size)
        raise ElasticError("train_batch_size", f"train_batch_size {train_batch_size} is not a whole number of "
                           f"train_micro_batch_size_per_gpu ({micro_batch}) x world size ({world_size}), so the "
                           f"global batch cannot be kept at world {world_size}",
                           f"restart at {near} ranks" if near else "choose a train_batch_size that divides",
                           kind="world")
    return train_batch_size // (micro_batch * world_size)
