"""The doctor's collective, run as every rank of the plan (``zerorun ... -m launcher.doctor.collective_rank``).

A gloo all-reduce over every rank (its sum checked), the same over NCCL where the ranks
have GPUs, then a latency/bandwidth matrix between the nodes: for each pair of nodes,
in turn, their local rank 0s ping-pong a one-element tensor (latency: half the median
round trip) and a 4 MiB one (bandwidth: bytes moved both ways over the time). Rank 0
prints one line, ``zerorun-doctor-collective {json}``, that the doctor reads from the
launcher's output. Argument: the seconds any collective may wait (gloo's timeout).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TAG = "zerorun-doctor-collective"
PINGS = 20
BANDWIDTH_BYTES = 4 << 20
BANDWIDTH_ROUNDS = 3


def all_reduce_seconds(device: str, group: dist.ProcessGroup | None = None) -> tuple[bool, float]:
    """One all-reduce of rank+1 on ``device``: whether it summed right, and how long it took."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1,), float(rank + 1), device=device)
    start = time.perf_counter()
    dist.all_reduce(t, group=group)
    took = time.perf_counter() - start
    return t.item() == world * (world + 1) / 2, took


def ping_pong(me: int, peer: int, first: bool, t: torch.Tensor, rounds: int) -> list[float]:
    """Round-trip times of ``t`` between ``me`` and ``peer`` (``first`` sends first)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        if first:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        times.append(time.perf_counter() - start)
    return times


def link_matrix(leaders: list[int]) -> list[tuple[int, int, float, float]]:
    """``(node_a, node_b, latency_s, bytes_per_s)`` for every pair of nodes, one pair at a time."""
    me, pairs = dist.get_rank(), [(a, b) for a in range(len(leaders)) for b in range(a + 1, len(leaders))]
    out = torch.zeros(len(pairs), 2, dtype=torch.float64)
    small, big = torch.zeros(1), torch.zeros(BANDWIDTH_BYTES // 4)
    for i, (a, b) in enumerate(pairs):
        if me in (leaders[a], leaders[b]):
            peer, first = (leaders[b], True) if me == leaders[a] else (leaders[a], False)
            ping_pong(me, peer, first, small, 2)  # the connection's set-up is not the link's latency
            lat = statistics.median(ping_pong(me, peer, first, small, PINGS)) / 2
            moved = sum(ping_pong(me, peer, first, big, BANDWIDTH_ROUNDS))
            if first:
                out[i] = torch.tensor([lat, 2 * BANDWIDTH_BYTES * BANDWIDTH_ROUNDS / moved], dtype=torch.float64)
        dist.barrier()  # one pair at a time: no two pairs share a link while measured
    dist.all_reduce(out)  # every cell was filled by one rank, zeros elsewhere
    return [(a, b, float(out[i, 0]), float(out[i, 1])) for i, (a, b) in enumerate(pairs)]


def main(timeout: float) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    node, local = int(os.environ["NODE_RANK"]), int(os.environ["LOCAL_RANK"])
    result: dict[str, object] = {"world": world}
    result["gloo_ok"], result["gloo_seconds"] = all_reduce_seconds("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(local % torch.cuda.device_count())
        nccl = dist.new_group(backend="nccl")
        result["nccl_ok"], result["nccl_seconds"] = all_reduce_seconds("cuda", nccl)
    where = torch.tensor([node, local])
    every = [torch.zeros(2, dtype=where.dtype) for _ in range(world)]
    dist.all_gather(every, where)
    leaders = sorted((int(w[0]), r) for r, w in enumerate(every) if int(w[1]) == 0)
    result["links"] = [{"a": a, "b": b, "latency_s": lat, "bytes_per_s": bw}
                       for a, b, lat, bw in link_matrix([r for _, r in leaders])]
    if rank == 0:
        print(TAG, json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    given = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher may pass --local_rank=N
    main(float(given[0]) if given else 30.0)
