"""The figures the engine reports: memory held per rank, communication, throughput.

Tests, the benchmark, ``estimate`` and ``autotune`` read these same numbers.

``memory_breakdown`` keys (int bytes held by this rank):
  * ``params``: the compute copies of the parameters (the flat buckets, padding included;
    at stage 3 the rank's shards plus the persistent and currently gathered buckets);
  * ``gradients``: gradient storage that persists through backward (full buffers at
    stages 0/1; the fp32 accumulation shard at stage 2);
  * ``master_params``: fp32 master weights held *in addition* to ``params``
    (0 with fp32 compute, where the master is the parameter buffer itself);
  * ``optimizer_states``: the optimizer's state tensors (e.g. Adam's two moments);
  * ``buffers``: communication buffers (stage-2/3 gradient staging buckets).

The engine's ``memory_breakdown()`` adds the physical keys of
:mod:`zerorun.engine.physical_memory` (``host_rss``, ``host_peak_rss``, ``host_baseline_rss``;
``device_peak_*`` on CUDA): what the process really holds, beside what the engine counts.
Sum only :data:`MEMORY_KEYS` (:func:`model_state_bytes`) for the bookkeeping total.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

MEMORY_KEYS = ("params", "gradients", "master_params", "optimizer_states", "buffers")


def model_state_bytes(breakdown: dict[str, int]) -> int:
    """The bookkeeping total of a breakdown: the five model-state keys, never the physical ones."""
    return sum(int(breakdown.get(key, 0)) for key in MEMORY_KEYS)


def memory_breakdown(params: int, gradients: int, master_params: int, optimizer_states: int,
                     buffers: int) -> dict[str, int]:
    return {"params": int(params), "gradients": int(gradients), "master_params": int(master_params),
            "optimizer_states": int(optimizer_states), "buffers": int(buffers)}


@dataclass
class Throughput:
    """Samples (and tokens) per second between optimizer steps, reported every ``interval`` steps."""

    samples_per_step: int
    tokens_per_sample: int | None = None
    _t_last: float = field(default_factory=time.perf_counter)
    _steps: int = 0
    _elapsed: float = 0.0
    last_step_s: float = 0.0
    # since the engine started, the first step left out (it holds the set-up and first-call costs)
    total_steps: int = -1
    total_elapsed: float = 0.0

    def tick(self) -> None:
        now = time.perf_counter()
        self.last_step_s = now - self._t_last
        self._elapsed += self.last_step_s
        self._steps += 1
        self._t_last = now
        self.total_steps += 1
        if self.total_steps > 0:
            self.total_elapsed += self.last_step_s

    def avg_samples_per_sec(self) -> float:
        """Samples per second over every step but the first (DeepSpeed's ``tput_timer`` figure); 0 before."""
        return self.total_steps * self.samples_per_step / self.total_elapsed if self.total_elapsed > 0 else 0.0

    def rates(self) -> dict[str, float]:
        """Mean rates since the last ``reset`` (then starts a new window)."""
        secs = max(self._elapsed, 1e-12)
        out = {"step_s": secs / max(self._steps, 1),
               "samples_per_s": self._steps * self.samples_per_step / secs}
        if self.tokens_per_sample:
            out["tokens_per_s"] = out["samples_per_s"] * self.tokens_per_sample
        self._steps, self._elapsed = 0, 0.0
        return out


def format_progress(step: int, loss: float | None, lr: list[float], rates: dict[str, float],
                    loss_scale: float, skipped: int) -> str:
    parts = [f"step {step}"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    parts.append("lr " + ",".join(f"{x:.3g}" for x in lr))
    parts.append(f"{rates['samples_per_s']:.1f} samples/s")
    if "tokens_per_s" in rates:
        parts.append(f"{rates['tokens_per_s']:.0f} tokens/s")
    parts.append(f"{rates['step_s'] * 1000:.0f} ms/step")
    if loss_scale != 1.0 or skipped:
        parts.append(f"loss_scale {loss_scale:g} skipped {skipped}")
    return " | ".join(parts)


def format_memory(breakdown: dict[str, int]) -> str:
    """``memory_breakdown()`` for people: ``params 1.50 MiB | gradients ... | total 6.00 MiB``,
    then the physical figures when present (``| host_peak_rss 1.20 GiB | ...``)."""
    from zerorun.engine.physical_memory import PHYSICAL_KEYS
    from zerorun.estimate.counts import human_bytes

    kept = {key: value for key, value in breakdown.items() if key not in PHYSICAL_KEYS}
    parts = [f"{key} {human_bytes(value)}" for key, value in kept.items()]
    physical = [f"{key} {human_bytes(breakdown[key])}" for key in PHYSICAL_KEYS if key in breakdown]
    return " | ".join([*parts, f"total {human_bytes(sum(kept.values()))}", *physical])


def sum_counts(snapshots: list[dict[str, dict[str, int | str]]]) -> dict[str, dict[str, int | str]]:
    """Several groups' collective counts (``CommCounter.snapshot``) as one: calls, bytes and elements
    summed per kind; ``via`` is the first group's (the world's)."""
    out: dict[str, dict[str, int | str]] = {}
    for snap in snapshots:
        for kind, row in snap.items():
            into = out.setdefault(kind, {"calls": 0, "bytes": 0, "elements": 0})
            for key in ("calls", "bytes", "elements"):
                into[key] = int(into[key]) + int(row[key])
            if "via" in row and "via" not in into:
                into["via"] = row["via"]
    return out
