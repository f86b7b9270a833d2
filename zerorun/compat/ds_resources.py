"""DeepSpeed's resource helpers (``deepspeed.launcher.runner``, ``deepspeed.utils.numa``), with its data shapes.

DeepSpeed's launcher helpers speak in dicts, ``{host: slot_count}`` for a hostfile and
``{host: [slot, ...]}`` for the resources a filter leaves, and raise ``ValueError`` for
every bad input. Tools and tests call them by these names, so they keep that contract;
the grammar of an ``--include``/``--exclude`` string is zerorun's own parser
(:func:`launcher.plan.filters.parse_filter`, DeepSpeed's grammar plus slot ranges), whose
errors become ``ValueError`` here. zerorun's launcher itself uses :mod:`launcher.plan.hostfile`
and :mod:`launcher.plan.filters` (typed hosts, ``file:line`` errors); these are the shim.
"""

from __future__ import annotations

import base64
import json
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from launcher.errors import FilterError
from launcher.plan.filters import parse_filter

_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")


def parse_hostfile_lines(lines: Iterable[str]) -> OrderedDict[str, int]:
    """``["w1 slots=2", "# c", ""]`` -> ``{"w1": 2}``; a bad or repeated line, or none at all, is ValueError."""
    pool: OrderedDict[str, int] = OrderedDict()
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.search(line)
        if match is None:
            raise ValueError(f"Hostfile contains a bad entry: {line}, unable to proceed with launching")
        host = match.group(1)
        if host in pool:
            raise ValueError(f"Hostfile contains multiple entries for {host}, unable to proceed with launching")
        pool[host] = int(match.group(2))
    if not pool:
        raise ValueError("Hostfile is empty or not formatted correctly, unable to proceed with launching.")
    return pool


def _parsed(text: str, flag: str) -> dict[str, set[int] | None]:
    try:
        return parse_filter(text, flag)
    except FilterError as exc:
        raise ValueError(str(exc)) from None


def _checked(host_info: Mapping[str, Sequence[int]], name: str, slots: set[int] | None) -> None:
    if name not in host_info:
        raise ValueError(f"Hostname '{name}' not found in hostfile")
    for slot in sorted(slots or ()):
        if slot not in host_info[name]:
            raise ValueError(f"No slot '{slot}' specified on host '{name}'")


def parse_resource_filter(host_info: Mapping[str, Sequence[int]], include_str: str = "",
                          exclude_str: str = "") -> Mapping[str, list[int]]:
    """Filter ``{host: [slots]}`` by an include or an exclude string; the result keeps ``host_info``'s order.

    Unfiltered, ``host_info`` itself is returned (DeepSpeed's no-op). An unknown host or
    slot, a malformed string, or both strings at once is ValueError.
    """
    if include_str and exclude_str:
        raise ValueError("include_str and exclude_str are mutually exclusive.")
    if not include_str and not exclude_str:
        return host_info
    flag, text = ("--include", include_str) if include_str else ("--exclude", exclude_str)
    chosen: dict[str, list[int]] = {} if include_str else {h: list(s) for h, s in host_info.items()}
    for name, slots in _parsed(text, flag).items():
        _checked(host_info, name, slots)
        picked = list(host_info[name]) if slots is None else sorted(slots)
        if include_str:
            chosen[name] = picked
        else:
            chosen[name] = [s for s in chosen[name] if s not in picked]
    return OrderedDict((h, chosen[h]) for h in host_info if chosen.get(h))


def parse_inclusion_exclusion(resource_pool: Mapping[str, int], inclusion: str,
                              exclusion: str) -> Mapping[str, list[int]]:
    """A hostfile's ``{host: count}`` -> the ``{host: [slots]}`` that ``-i``/``-e`` leave."""
    active = OrderedDict((host, list(range(count))) for host, count in resource_pool.items())
    return parse_resource_filter(active, include_str=inclusion, exclude_str=exclusion)


def apply_num_nodes_and_gpus(active: Mapping[str, list[int]], num_nodes: int,
                             num_gpus: int) -> Mapping[str, list[int]]:
    """The first ``num_nodes`` hosts and slots ``0..num_gpus-1`` of each (a value <= 0 keeps everything)."""
    hosts = list(active)[:num_nodes] if num_nodes > 0 else list(active)
    return OrderedDict((h, list(range(num_gpus)) if num_gpus > 0 else list(active[h])) for h in hosts)


def encode_world_info(world_info: Mapping[str, Sequence[int]]) -> str:
    """``{host: [slots]}`` as DeepSpeed's ``--world_info``: URL-safe base64 of its JSON."""
    return base64.urlsafe_b64encode(json.dumps(world_info).encode("utf-8")).decode("utf-8")


def decode_world_info(text: str) -> dict[str, list[int]]:
    """The inverse of :func:`encode_world_info`; anything but ``{str: [int]}`` is ValueError."""
    try:
        data = json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
    except (ValueError, UnicodeError) as exc:
        raise ValueError(f"world info is not base64 of JSON: {exc}") from None
    if not isinstance(data, dict) or not all(
            isinstance(v, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in v) for v in data.values()):
        raise ValueError("world info must map each host to a list of slot ids")
    return data


def _range(item: str) -> range:
    lo, sep, hi = item.strip().partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise ValueError(f"Bad range: '{item}', range must be either a number or two number separated by dash")
    start, end = int(lo), int(hi if sep else lo)
    if start > end:
        raise ValueError(f"Bad range: '{item}', range end must larger than or equal to start")
    return range(start, end + 1)


def parse_range_list(text: str) -> list[int]:
    """``"0,2-4,6"`` -> ``[0, 2, 3, 4, 6]``; ranges must ascend without overlap (DeepSpeed's core lists)."""
    cores: list[int] = []
    for item in text.split(","):
        span = _range(item)
        if cores and span.start <= cores[-1]:
            raise ValueError(f"Bad range: '{item}' overlaps or comes before {cores[-1]}: list ranges in ascending order")
        cores.extend(span)
    return cores
