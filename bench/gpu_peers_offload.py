"""Part 2 of ``scripts/gpu_check.sh --peers``: the largest model one capped GPU trains with offload.

For each placement (stage 2 + ``offload_optimizer: cpu``; stage 3 + optimizer and parameters on
``cpu``; the same on ``nvme``) and each system (zerorun, DeepSpeed), the depth of a fixed-width
decoder (bench/gpu_peers_model.OFFLOAD_GPU: Llama 2 7B's width, 202M parameters a layer) is
searched: the first probe at the depth zerorun's estimate says fits the capped card, the host's
memory and the disk; then up by 1.25x while it trains, down by 0.8x while it does not, then
bisection. A probe is one fresh process training 3 steps (bench/gpu_peers_systems.py); it fits when
its losses are finite, fails on an out-of-memory (the device's or, killed, the host's), and is
unknown when it runs out of time (the search then goes down); any other error ends that search
with the error beside it (not a matter of size: DeepSpeed's NVMe needs its async_io op, say). The searches take turns a probe at a time, so when the part's
time is up every search has had its share; each result says whether its bracket closed.

Then zerorun runs at DeepSpeed's largest depth of each placement (when not already probed there):
the step times side by side. Every probe that trained carries its device peak
(``max_memory_allocated``) beside the estimate's row for that depth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.gpu_peers_model import Shape
from zerorun.estimate import (
    ActivationPolicy,
    Dtype,
    EstimateRequest,
    ModelShape,
    Optimizer,
    Placement,
    Training,
    estimate_row,
)
from zerorun.estimate.model_states import Offload

PLACEMENTS: dict[str, tuple[int, str]] = {"stage2-cpu": (2, "cpu"), "stage3-cpu": (3, "cpu"), "stage3-nvme": (3, "nvme")}
SYSTEMS = ("zerorun", "ds")
GiB = 2**30

Probe = Callable[[str, str, int, float], dict[str, Any]]
"""(system family, placement, depth, seconds allowed) -> the probe's JSON line (``fits``, ``step_s``, ...)."""


def estimate(shape: Shape, stage: int, offload: str, overhead: int = 0) -> Any:
    """zerorun's estimate row for ``shape`` at world 1, bf16, AdamW, recomputed layers, fused attention."""
    where = Offload(offload)
    placement = Placement(stage, offload_optimizer=where, offload_param=where if stage == 3 else Offload.NONE)
    model = ModelShape(hidden=shape.dim, layers=shape.layers, heads=shape.heads, vocab=shape.vocab, ffn=shape.ffn,
                       gated_mlp=True, tied_embeddings=False, seq_len=shape.seq, micro_batch=shape.batch)
    request = EstimateRequest(Training(shape.params, 1, Dtype.BF16, Optimizer.ADAMW), gpus_per_node=1, shape=model,
                              activation_policy=ActivationPolicy(checkpointing=True, flash_attention=True),
                              overhead=overhead)
    return estimate_row(request, placement)


def predicted_depth(shape: Shape, stage: int, offload: str, card: int, host: int, disk: int, hi: int) -> int:
    """The largest depth in 1..hi whose estimate fits the card, the host's memory and the disk (at least 1)."""
    best = 1
    for depth in range(1, hi + 1):
        row = estimate(shape.with_layers(depth), stage, offload)
        if row.total > card or row.cpu_per_node > host or row.nvme_per_node > disk:
            break
        best = depth
    return best


def next_depth(results: dict[int, bool], start: int, lo: int, hi: int) -> int | None:
    """The next depth to probe, or None when the bracket is closed (adjacent depths) or a bound is reached.

    ``results``: depth -> trained (a probe out of time counts as not trained: the search goes down)."""
    if not results:
        return min(hi, max(lo, start))
    fit = [d for d, ok in results.items() if ok]
    best = max(fit, default=None)
    if best is None:  # nothing trained yet: down by 0.8x
        worst = min(results)
        nxt = max(lo, min(worst - 1, worst * 4 // 5))
        return nxt if nxt < worst and nxt not in results else None
    worst = min((d for d, ok in results.items() if not ok and d > best), default=None)
    if worst is None:  # nothing failed above the best yet: up by 1.25x
        nxt = min(hi, max(best + 1, best * 5 // 4))
        return nxt if nxt > best and nxt not in results else None
    if worst - best <= 1:
        return None
    return (best + worst) // 2


def search(probe: Probe, starts: dict[str, int], lo: int, hi: int, deadline: float, probe_cap: float,
           max_rounds: int = 1000) -> dict[str, dict[str, Any]]:
    """Every (system, placement) search in turns; ``starts``: placement -> first depth."""
    keys = [(s, p) for p in PLACEMENTS for s in SYSTEMS]
    state: dict[tuple[str, str], dict[int, bool]] = {k: {} for k in keys}
    probes: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in keys}
    closed: dict[tuple[str, str], bool] = dict.fromkeys(keys, False)
    stopped: dict[tuple[str, str], str] = {}
    for _ in range(max_rounds):
        active = False
        for key in keys:
            if closed[key]:
                continue
            depth = next_depth(state[key], starts[key[1]], lo, hi)
            left = deadline - time.monotonic()
            if depth is None:
                closed[key] = True
                continue
            if left < 5:
                break
            active = True
            out = probe(key[0], key[1], depth, min(probe_cap, left))
            out["depth"] = depth
            state[key][depth] = bool(out.get("fits"))
            probes[key].append(out)
            if out.get("skipped") or (out.get("error") and not out.get("oom")):
                closed[key] = True  # not a matter of size (no DeepSpeed, an op that does not build): said, not searched
                stopped[key] = out.get("skipped") or out["error"]
        if not active:
            break
    return {f"{s}/{p}": {"probes": probes[(s, p)], "closed": closed[(s, p)], "stopped": stopped.get((s, p)),
                         "largest_depth": max((d for d, ok in state[(s, p)].items() if ok), default=None)}
            for s, p in keys}


def compare_at_ds_largest(results: dict[str, dict[str, Any]], probe: Probe, deadline: float, probe_cap: float,
                          shape: Shape) -> dict[str, Any]:
    """Per placement: both systems' step time at DeepSpeed's largest depth, and the largest-model ratio."""
    out: dict[str, Any] = {}
    for placement in PLACEMENTS:
        zr, ds = results[f"zerorun/{placement}"], results[f"ds/{placement}"]
        row: dict[str, Any] = {"zerorun_largest_depth": zr["largest_depth"], "ds_largest_depth": ds["largest_depth"]}
        for name, depth in (("zerorun", zr["largest_depth"]), ("ds", ds["largest_depth"])):
            row[f"{name}_largest_params"] = shape.with_layers(depth).params if depth else None
        if row["zerorun_largest_params"] and row["ds_largest_params"]:
            row["largest_ratio"] = row["zerorun_largest_params"] / row["ds_largest_params"]
        depth = ds["largest_depth"]
        if depth:
            ds_probe = next(p for p in ds["probes"] if p["depth"] == depth)
            zr_probe = next((p for p in zr["probes"] if p["depth"] == depth), None)
            left = deadline - time.monotonic()
            if zr_probe is None and left > 5:
                zr_probe = probe("zerorun", placement, depth, min(probe_cap, left))
                zr_probe["depth"] = depth
                zr["probes"].append(zr_probe)
            row["depth"] = depth
            row["ds_step_s"] = ds_probe.get("step_s")
            row["zerorun_step_s"] = zr_probe.get("step_s") if zr_probe else None
            if row["ds_step_s"] and row["zerorun_step_s"]:
                row["step_ratio"] = row["zerorun_step_s"] / row["ds_step_s"]
        out[placement] = row
    return out


def with_estimates(results: dict[str, dict[str, Any]], shape: Shape) -> None:
    """Each probe that trained: zerorun's estimate row for its depth beside the device's peak."""
    for key, res in results.items():
        stage, offload = PLACEMENTS[key.split("/", 1)[1]]
        for p in res["probes"]:
            row = estimate(shape.with_layers(p["depth"]), stage, offload)
            p["estimate_gpu"] = dict(row.gpu)
            p["estimate_total_no_overhead"] = row.total - row.gpu.get("overhead", 0)
            p["estimate_cpu"], p["estimate_nvme"] = row.cpu_per_node, row.nvme_per_node
            peak = p.get("max_memory_allocated")
            if peak and p.get("fits"):
                p["peak_over_estimate"] = peak / p["estimate_total_no_overhead"]
