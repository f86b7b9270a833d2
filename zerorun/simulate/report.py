"""``zerorun simulate``'s output: one JSON document, or text lines of at most 80 columns.

Both carry the same figures: the engine's memory terms beside the estimate's, the
physical peak per phase (CPU mode), communication per step and at set-up in Psi and
bytes, and the time taken.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from zerorun.estimate.counts import human_bytes
from zerorun.estimate.topology import Link
from zerorun.simulate.compare import STATE_TERMS, Comparison, moved_bytes, volume
from zerorun.simulate.run import PHASES, Counts, SimResult


def _traffic(counts: Counts, psi: int) -> dict[str, Any]:
    return {"psi": volume(counts) / psi, "elements": volume(counts), "bytes": moved_bytes(counts), "by_kind": counts}


def to_json(result: SimResult, comparison: Comparison) -> dict[str, Any]:
    psi = result.psi
    window = comparison.window
    return {
        "world_size": result.world_size, "rank": result.rank, "device": result.device, "model": result.model,
        "stage": result.stage, "dtype": result.dtype, "optimizer": result.optimizer, "params": psi,
        "buckets": result.buckets, "persistent_numel": result.persistent_numel,
        "memory": {"simulated": result.memory, "estimate": comparison.states,
                   "model_states_bound_bytes": comparison.bound,
                   "estimate_buffers": comparison.buffers, "estimate_total_per_gpu": comparison.total,
                   "params_after_forward": result.forward_params},
        "stage3_window": None if result.stage != 3 else {
            "kept_numel": result.kept_numel, "peak_live_numel": result.peak_live_numel,
            "estimate": None if window is None else asdict(window)},
        "phases": {name: asdict(result.phases[name]) for name in PHASES},
        "communication": {
            "setup": _traffic(result.setup, psi),
            "steps": [_traffic(s, psi) for s in result.steps],
            "estimate_psi": {"first_step": comparison.first_step_numel / psi,
                             "later_steps": comparison.later_step_numel / psi},
            "by_link": None if comparison.links is None else comparison.links.to_json(),
        },
        **_resident_json(result, comparison),
        "seconds": result.seconds,
    }


def _resident_json(result: SimResult, comparison: Comparison) -> dict[str, Any]:
    """The device's model state at its peak and the host's bytes per node, beside the estimate's row for the
    config's own placement (None where the simulation cannot tell the two apart: on the CPU)."""
    placed = comparison.placed
    per_node = placed.ranks_per_node if placed else 1
    return {
        "device_model_state_peak_bytes": result.device_model_state_peak,
        "host_bytes_per_node": None if result.host_peak is None else result.host_peak * per_node,
        "placement": None if placed is None else {
            "row": placed.label, "ranks_per_node": per_node,
            "estimate": {"device_model_state_bytes": placed.device_model_state,
                         "host_bytes_per_node": placed.host_per_node, "nvme_bytes_per_node": placed.nvme_per_node}},
    }


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + human_bytes(abs(n))


def _memory_lines(result: SimResult, comparison: Comparison) -> list[str]:
    lines = [f"{'memory per rank (bookkeeping)':<30}{'simulated':>14}{'estimate':>14}{'difference':>14}"]
    for term in STATE_TERMS:
        sim, est = result.memory[term], comparison.states[term]
        lines.append(f"  {term:<28}{human_bytes(sim):>14}{human_bytes(est):>14}{_signed(sim - est):>14}")
    sim_total = sum(result.memory[t] for t in STATE_TERMS)
    est_total = sum(comparison.states.values())
    lines.append(f"  {'model states':<28}{human_bytes(sim_total):>14}{human_bytes(est_total):>14}"
                 f"{_signed(sim_total - est_total):>14}")
    lines.append(f"  (padding, persistent buckets and step counters allow up to {human_bytes(comparison.bound)})")
    staging = comparison.buffers.get("reduce_staging", 0)
    lines.append(f"  {'buffers (reduce staging)':<28}{human_bytes(result.memory['buffers']):>14}"
                 f"{human_bytes(staging):>14}")
    lines += ["  (buffers differ by design: simulated, every staging buffer the engine",
              "   holds after its steps, up to 4 of its largest bucket's padded size as",
              "   backward runs ahead of the reductions, and stage 3's coalescing group;",
              "   estimate, the steady state: one reduce_bucket_size buffer, two with",
              "   overlap_comm)"]
    lines.append(f"  {'params when forward ends':<28}{human_bytes(result.forward_params):>14}")
    if result.stage == 3 and result.kept_numel is not None:
        window = comparison.window
        est = "" if window is None else f"{window.kept_numel:,}"
        lines.append(f"  {'kept gathered (elements)':<28}{result.kept_numel:>14,}{est:>14}")
        est = "" if window is None else f"{window.peak_live_numel:,}"
        lines.append(f"  {'peak gathered (elements)':<28}{result.peak_live_numel or 0:>14,}{est:>14}")
    lines.append(f"  {'estimate, whole row per GPU':<28}{'':>14}{human_bytes(comparison.total):>14}")
    placed = comparison.placed
    if placed is not None and result.device_model_state_peak is not None and result.host_peak is not None:
        lines.append(f"  {placed.label} (resident, activations excluded):")
        lines.append(f"  {'  device model state, peak':<28}{human_bytes(result.device_model_state_peak):>14}"
                     f"{human_bytes(placed.device_model_state):>14}")
        lines.append(f"  {f'  host, {placed.ranks_per_node} rank(s) a node':<28}"
                     f"{human_bytes(result.host_peak * placed.ranks_per_node):>14}"
                     f"{human_bytes(placed.host_per_node):>14}")
    return lines


def _phase_lines(result: SimResult) -> list[str]:
    lines = [f"{'physical peak per phase (RSS)':<30}{'start':>12}{'peak':>12}{'rise':>12}{'seconds':>10}"]
    for name in PHASES:
        p = result.phases[name]
        if p.rss_peak is None:
            start = peak = rise = "-"
        else:
            start, peak = human_bytes(p.rss_start or 0), human_bytes(p.rss_peak)
            rise = _signed(p.rss_peak - (p.rss_start or 0))
        lines.append(f"  {name:<28}{start:>12}{peak:>12}{rise:>12}{p.seconds:>10.2f}")
    if result.device == "meta":
        lines.append("  (meta device: nothing is allocated, so there is no physical peak)")
    return lines


def _comm_lines(result: SimResult, comparison: Comparison) -> list[str]:
    psi = result.psi
    lines = [f"{'communication per rank':<30}{'Psi':>10}{'bytes':>14}{'estimate Psi':>14}"]
    for i, step in enumerate(result.steps):
        est = comparison.first_step_numel if i == 0 else comparison.later_step_numel
        lines.append(f"  {f'step {i + 1}':<28}{volume(step) / psi:>10.4f}{human_bytes(moved_bytes(step)):>14}"
                     f"{est / psi:>14.4f}")
    lines.append(f"  {'set-up':<28}{volume(result.setup) / psi:>10.4f}"
                 f"{human_bytes(moved_bytes(result.setup)):>14}")
    return lines


def _link_lines(result: SimResult, comparison: Comparison) -> list[str]:
    """The last simulated step's bytes by kind and link beside the estimate's same step."""
    links = comparison.links
    if links is None or not links.steps:
        return []
    est = links.estimate
    last = len(links.steps)
    est_step = est.first_step if last == 1 else est.later_steps
    layout = est.layout
    lines = [f"per link, step {last}: {est.policy.label()}, {layout.nodes} node(s) of {layout.per_node}",
             f"  {'':<24}{'inside':>12}{'across':>12}{'est. inside':>14}{'est. across':>14}"]
    sim_total, est_total = sum(links.steps[-1].values(), Link()), sum(est_step.values(), Link())
    rows = [*links.steps[-1].items(), ("total", sim_total)]
    for kind, link in rows:
        if kind == "replica_all_reduce" and est.policy.mics <= 0:
            continue
        e = est_total if kind == "total" else est_step[kind]
        lines.append(f"  {kind.replace('_', ' '):<24}{human_bytes(link.inside):>12}{human_bytes(link.across):>12}"
                     f"{human_bytes(e.inside):>14}{human_bytes(e.across):>14}")
    if est.policy.hpz > 1:
        lines.append(f"  {'hpZ secondary copy':<24}{human_bytes(links.secondary_bytes):>24}"
                     f"{human_bytes(est.secondary_bytes):>28}")
    if est.policy.mics > 0:
        lines.append(f"  (MiCS: the engine ran as rank {result.rank} of its shard group of {result.world_size};"
                     " model states above are per rank)")
    lines.append("  (projected: the engine runs plain stage 3; see docs/zeropp.md)"
                 if not est.policy.plain else "  (inside includes the rank's own shard, which does not move)")
    return lines


def render(result: SimResult, comparison: Comparison) -> list[str]:
    """The text form; no line is longer than 80 columns."""
    where = "meta device (no storage)" if result.device == "meta" else "CPU (real allocations)"
    head = [
        f"simulated rank {result.rank} of {result.world_size} on the {where}, {len(result.steps)} step(s)",
        f"model   {result.model}: {result.psi:,} parameters, {result.buckets} buckets",
        f"config  stage {result.stage}, {result.dtype}, {result.optimizer or 'client optimizer'}",
        "",
    ]
    body = [*_memory_lines(result, comparison), "", *_phase_lines(result), "", *_comm_lines(result, comparison)]
    link_lines = _link_lines(result, comparison)
    body += ["", *link_lines] if link_lines else []
    return [*head, *body, "", f"time taken: {result.seconds:.1f} s"]
