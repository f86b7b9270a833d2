"""The communication logger: per collective and message size, how many ran, how long each took
and the bandwidth it reached (the ``comms_logger`` config block; DeepSpeed's ``CommsLogger``).

``comms_dict`` is ``{op name: {message size in bytes: [count, latencies ms, algbws, busbws]}}``;
index i of the three lists is the i-th recorded op. Summaries are trimmed means (10 % off each
end) computed on sorted copies, so the records keep their pairing.

The engine feeds the process-wide :data:`LOGGER` from one place, the completion of a traced
collective (:func:`zerorun.engine.comm.trace.complete`), only while ``LOGGER.enabled``; the
kinds it counts in ``engine.comm_stats()`` are recorded under DeepSpeed's names (:data:`ENGINE_NAMES`),
with the message size the engine counts (the full buffer: an all-reduce's or reduce-scatter's
input, an all-gather's output) and the time from issue to completion (for an overlapped
collective that includes the compute it overlapped: DeepSpeed instead makes the op blocking).
Bandwidths follow nccl-tests' definitions as DeepSpeed computes them, in Gbps over the world size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from statistics import mean
from typing import Any

import torch.distributed as dist

_log = logging.getLogger("DeepSpeed")

ENGINE_NAMES = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter_tensor",
                "all_gather": "all_gather_into_tensor", "broadcast": "broadcast"}
"""Engine kind (``engine.comm_stats()``) -> the name DeepSpeed logs that collective under."""

_GATHER_SCATTER = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor")
_ALL_REDUCE = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce")
_POINT = ("send", "recv", "isend", "irecv", "broadcast", "reduce", "gather", "scatter", "barrier")

Record = list[Any]
"""``[count, latencies, algbws, busbws]``."""


def trim_mean(data: Sequence[float], trim_percent: float) -> float:
    """The mean of ``data`` without its ``round(n * trim_percent)`` smallest and largest values;
    0 for no data. ``data`` is left as it is (a sorted copy is trimmed)."""
    if not 0.0 <= trim_percent <= 1.0:
        raise ValueError(f"trim_percent must be in [0, 1], got {trim_percent}")
    n = len(data)
    if n == 0:
        return 0
    ordered = sorted(data)
    k = int(round(n * trim_percent))
    return mean(ordered[k:n - k])


def convert_size(size_bytes: int) -> str:
    """``1536`` -> ``"1.5 KB"`` (powers of 1024)."""
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = int(math.floor(math.log(size_bytes, 1024)))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {names[i]}"


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def calc_bw_log(comm_op: str, size: float, duration: float, n: int | None = None) -> tuple[float, float]:
    """``(algbw, busbw)`` in Gbps of ``comm_op`` moving ``size`` bytes (an all-gather's or
    reduce-scatter's per-rank part) in ``duration`` ms over ``n`` ranks (default: the world)."""
    n = world_size() if n is None else n
    if duration <= 0:
        return 0.0, 0.0
    if comm_op == "all_to_all_single":
        tput, busbw = size / duration, size / duration * ((n - 1) / n)
    elif comm_op in _GATHER_SCATTER:
        tput = size * n / duration
        busbw = tput * ((n - 1) / n)
    elif comm_op in _ALL_REDUCE:
        tput, busbw = size * 2 / duration, size / duration * (2 * (n - 1) / n)
    elif comm_op in _POINT:
        tput = busbw = size / duration
    else:
        raise ValueError(f"no bandwidth formula for the collective {comm_op!r}")
    return tput * 8 / 1e6, busbw * 8 / 1e6  # bytes/ms -> Gbps


class CommsLogger:
    """Records collectives into ``comms_dict`` while ``enabled`` and the op is profiled
    (``prof_all``, or its name in ``prof_ops``). Defaults as DeepSpeed's: off, ``prof_all`` on."""

    def __init__(self) -> None:
        self.comms_dict: dict[str, dict[int, Record]] = {}
        self.verbose = False
        self.debug = False
        self.prof_ops: list[str] = []
        self.prof_all = True
        self.enabled = False

    def configure(self, comms_config: Any) -> None:
        """From DeepSpeed's ``DeepSpeedCommsConfig`` (``comms_logger_enabled`` and its ``comms_logger``)
        or a ``comms_logger`` block itself; its ``enabled`` key turns recording on."""
        block = comms_config.comms_logger if getattr(comms_config, "comms_logger_enabled", False) else comms_config
        self.enabled = bool(getattr(block, "enabled", False))
        if self.enabled:
            self.verbose = bool(block.verbose)
            self.debug = bool(block.debug)
            self.prof_ops = list(block.prof_ops)
            self.prof_all = bool(block.prof_all)

    def start_profiling_comms(self) -> None:
        self.prof_all = True

    def stop_profiling_comms(self) -> None:
        self.prof_all = False

    def start_profiling_op(self, op_name_list: list[str]) -> None:
        self.prof_ops = list(set(self.prof_ops) | set(op_name_list))

    def stop_profiling_op(self, op_name_list: list[str]) -> None:
        self.prof_ops = [op for op in self.prof_ops if op not in op_name_list]

    def profiles(self, name: str, prof: bool = False) -> bool:
        """Whether an op logged as ``name`` (asked for with ``prof``) is recorded now."""
        return self.enabled and (prof or self.prof_all or name in self.prof_ops)

    def append(self, raw_name: str, record_name: str, latency: float, msg_size: int) -> None:
        """Record one ``raw_name`` op under ``record_name``: ``latency`` ms, ``msg_size`` bytes
        (an all-gather's or reduce-scatter's per-rank part)."""
        algbw, busbw = calc_bw_log(raw_name, msg_size, latency)
        self._add(record_name, msg_size, latency, algbw, busbw)

    def record_engine_op(self, kind: str, nbytes: int, seconds: float) -> None:
        """One engine collective of ``kind`` (``comm_stats()``'s name) over a buffer of ``nbytes``,
        complete ``seconds`` after it was issued; recorded if its DeepSpeed name is profiled."""
        name = ENGINE_NAMES.get(kind)
        if name is None or not (self.prof_all or name in self.prof_ops):
            return
        n = world_size()
        latency = seconds * 1e3
        per_rank = nbytes / n if name in _GATHER_SCATTER else nbytes
        algbw, busbw = calc_bw_log(name, per_rank, latency, n)
        self._add(name, nbytes, latency, algbw, busbw)

    def _add(self, name: str, msg_size: int, latency: float, algbw: float, busbw: float) -> None:
        by_size = self.comms_dict.setdefault(name, {})
        record = by_size.get(msg_size)
        if record is None:
            by_size[msg_size] = [1, [latency], [algbw], [busbw]]
        else:
            record[0] += 1
            record[1].append(latency)
            record[2].append(algbw)
            record[3].append(busbw)
        if self.verbose and rank() == 0:
            _log.info(f"comm op: {name} | time (ms): {latency:.2f} | msg size: {convert_size(msg_size)} | "
                      f"algbw (Gbps): {algbw:.2f} | busbw (Gbps): {busbw:.2f}")

    def get_raw_data(self) -> dict[str, dict[int, Record]]:
        return self.comms_dict.copy()

    def has_data(self) -> bool:
        return len(self.comms_dict) > 0

    def reset_data(self) -> None:
        self.comms_dict.clear()

    def get_operation_names(self) -> list[str]:
        return list(self.comms_dict)

    def get_total_operations(self) -> int:
        return sum(record[0] for by_size in self.comms_dict.values() for record in by_size.values())

    def get_operation_summary(self, operation_name: str) -> dict[int, dict[str, Any]] | None:
        """Per message size: count, total and trimmed-mean latency (ms), trimmed-mean bandwidths
        (Gbps); None for an op never recorded. The records are not touched."""
        if operation_name not in self.comms_dict:
            return None
        return {size: _summary(size, record) for size, record in self.comms_dict[operation_name].copy().items()}

    def log_all(self, print_log: bool = True, show_straggler: bool = False, return_dict: bool = False,
                reduce_min: Callable[[list[float]], list[float]] | None = None) -> dict[str, Any] | None:
        """Print (``print_log``) and/or return (``return_dict``) the summary table. ``show_straggler``
        adds each op's latency over the fastest rank's, from ``reduce_min`` (an element-wise MIN
        all-reduce across ranks, which every rank must call in the same order)."""
        snapshot = self.comms_dict.copy()
        result: dict[str, Any] = {"summary": {}, "straggler_analysis": None, "metadata": {
            "world_size": world_size(), "rank": rank(), "timestamp": datetime.now().isoformat()}}
        if print_log:
            print(_row("Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)",
                       "tput_avg (Gbps)", "busbw_avg (Gbps)"))
        for name, by_size in snapshot.items():
            if print_log:
                print(name)
            result["summary"][name] = {}
            for size, record in sorted(by_size.items()):
                s = result["summary"][name][size] = _summary(size, record)
                if print_log:
                    print(_row(" ", s["msg_size_str"], s["count"], f"{s['total_latency_ms']:.2f}",
                               f"{s['avg_latency_ms']:.2f}", f"{s['tput_avg_gbps']:.2f}", f"{s['busbw_avg_gbps']:.2f}"))
        if show_straggler:
            if reduce_min is None:
                raise ValueError("show_straggler needs reduce_min (deepspeed.comm.log_summary passes it)")
            result["straggler_analysis"] = _stragglers(snapshot, reduce_min, print_log)
        return result if return_dict else None


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _row(*cells: object) -> str:
    return "".join(f"{str(c): <20}" for c in cells)


def _summary(size: int, record: Record) -> dict[str, Any]:
    return {"count": record[0], "total_latency_ms": sum(record[1]), "avg_latency_ms": trim_mean(record[1], 0.1),
            "tput_avg_gbps": trim_mean(record[2], 0.1), "busbw_avg_gbps": trim_mean(record[3], 0.1),
            "msg_size_bytes": size, "msg_size_str": convert_size(size)}


def _stragglers(snapshot: dict[str, dict[int, Record]], reduce_min: Callable[[list[float]], list[float]],
                print_log: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if print_log:
        print("_______________________________\nBreakdown with straggler effect\n-------------------------------")
        print(_row("Comm. Op", "Message Size", "Count", "Total comm lat(ms)", "Total straggler(ms)",
                   "Avg comm lat(ms)", "Avg straggler(ms)"))
    for name, by_size in snapshot.items():
        if print_log:
            print(name)
        out[name] = {}
        for size, record in sorted(by_size.items()):
            lats = list(record[1])
            fastest = reduce_min(lats)
            late = [a - b for a, b in zip(lats, fastest, strict=True)]
            row = out[name][size] = {"count": record[0], "total_comm_lat_ms": sum(fastest),
                                     "total_straggler_ms": sum(late), "avg_comm_lat_ms": trim_mean(fastest, 0.1),
                                     "avg_straggler_ms": trim_mean(late, 0.1), "msg_size_bytes": size,
                                     "msg_size_str": convert_size(size)}
            if print_log:
                print(_row(" ", row["msg_size_str"], row["count"], f"{row['total_comm_lat_ms']:.2f}",
                           f"{row['total_straggler_ms']:.2f}", f"{row['avg_comm_lat_ms']:.2f}",
                           f"{row['avg_straggler_ms']:.2f}"))
    return out


LOGGER = CommsLogger()
"""The process's logger: the engine's collectives feed it, ``deepspeed.comm.log_summary()`` prints it."""
