"""Estimated against measured: what ``zerorun estimate --measure`` prints.

The measurement is a short run of the user's script under the bundled engine (the
autotune trial mechanism: ``ZERORUN_TRIAL_*`` variables, a JSON result); its
``facts`` carry ``engine.memory_breakdown()`` after the steps, every rank's physical
figures (peaks counted from the end of warm-up), the largest bucket and parameter, and
the config the engine really ran. The estimate here is computed for that same config,
so any ratio far from 1 is the estimate's error, not a different setup.

The figure that counts is the physical peak of the worse rank (the CUDA allocator's peak
on a GPU; on the CPU the RSS high-water mark less the resident set when zerorun was
imported) against the estimate's model states plus what a step holds in flight. The
engine's bookkeeping stays beside it, term by term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerorun.estimate.buffers import Buckets, stage3_gathered
from zerorun.estimate.in_flight import StepSizes, in_flight
from zerorun.estimate.model_states import Dtype, Offload, Optimizer, Placement, Training, engine_breakdown
from zerorun.estimate.transport import lane_bytes

TERMS = ("params", "gradients", "master_params", "optimizer_states", "buffers")

HOST_RUNTIME = 34 * 2**20
"""What a CPU rank's resident set gains in a training step whatever the model: gloo's process group
and its threads, the autograd engine, the BLAS and oneDNN scratch of the first matmuls, the Python
objects a first step creates. The CPU's counterpart of the estimate's CUDA overhead; measured as the
peak less the estimate on a model of 25k parameters, where every engine term is below 2 MiB
(``python bench/memory.py --world 2 --estimate --hidden 64 --layers 1``: 33-35 MiB at stages 0-3,
either allocator; torch 2.13, gloo)."""

MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's ceiling of its dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)."""


def allocator_retention(largest_freed: int, env: dict[str, str], kinds: int = 1) -> int:
    """Bytes glibc's default allocator may keep free in its heap within a step.

    Its thresholds move (mallopt(3)): freeing an mmapped chunk raises the mmap threshold to that
    chunk's size (at most :data:`MMAP_THRESHOLD_MAX`) and the trim threshold to twice it, so after
    the first step a buffer of ``largest_freed`` bytes comes from the heap and up to twice its size
    stays free there, untrimmed (the engine trims only a heap with much free). That for each of the
    ``kinds`` of large buffer freed all step long: stages 0-2 free the gradients autograd makes;
    stage 3 also its gathered units, between which the two leave each other holes (measured on the
    memory benchmark's model at 8-24 blocks, hidden 512-1024: twice the largest buffer left stage 3's
    peak 4-9% above the estimate, four times 1-5%). With either threshold fixed through the
    environment (``MALLOC_TRIM_THRESHOLD_``/``MALLOC_MMAP_THRESHOLD_``) nothing moves: the trim
    threshold is what may stay (glibc's default 128 KiB when only the mmap threshold is set)."""
    trim, mmap = (_threshold(env.get(k)) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"))
    if trim is not None:
        return trim
    if mmap is not None:
        return 128 * 1024
    return 2 * kinds * min(largest_freed, MMAP_THRESHOLD_MAX)


def _threshold(value: object) -> int | None:
    """A glibc threshold as a rank reported it (its environment: anyone's text), or None when it is not
    a plain count of bytes (then it is read as unset)."""
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else None


_OPTIMIZERS = {"adam": Optimizer.ADAM, "adamw": Optimizer.ADAMW, "sgd": Optimizer.SGD,
               "sgd-nomomentum": Optimizer.SGD_NO_MOMENTUM}


@dataclass(frozen=True)
class Comparison:
    """One term: the estimate, the engine's bookkeeping figure and bookkeeping / estimated."""

    term: str
    estimated: int
    measured: int

    @property
    def ratio(self) -> float | None:
        return None if self.estimated == 0 else self.measured / self.estimated

    def to_json(self) -> dict[str, Any]:
        return {"term": self.term, "estimated_bytes": self.estimated, "measured_bytes": self.measured,
                "ratio": self.ratio}


@dataclass(frozen=True)
class PhysicalPeak:
    """The worse rank's physical peak against the estimated total."""

    kind: str  # what was read: "device_peak_allocated" or "host_peak_rss - host_baseline_rss"
    per_rank: list[int]
    estimated: int

    @property
    def peak(self) -> int:
        return max(self.per_rank)

    @property
    def worst_rank(self) -> int:
        return self.per_rank.index(self.peak)

    @property
    def ratio(self) -> float | None:
        return None if self.estimated == 0 else self.peak / self.estimated

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "per_rank_bytes": self.per_rank, "worst_rank": self.worst_rank,
                "peak_bytes": self.peak, "estimated_bytes": self.estimated, "ratio": self.ratio}


def step_peak(figures: dict[str, int]) -> tuple[str, int] | None:
    """What a rank held at its peak, from its physical figures: the CUDA allocator's peak on a GPU,
    else the host high-water mark less the baseline. None when neither is known."""
    if "device_peak_allocated" in figures:
        return "device_peak_allocated", int(figures["device_peak_allocated"])
    if "host_peak_rss" in figures:
        return "host_peak_rss - host_baseline_rss", int(figures["host_peak_rss"] - figures["host_baseline_rss"])
    return None


def _sizes(facts: dict[str, Any], training: Training, stage: int, buckets: Buckets) -> StepSizes:
    """The in-flight sizes of the engine that ran: its largest bucket (a stage-3 unit) and parameter."""
    bucket = int(facts.get("largest_bucket") or 0)
    unit = bucket if stage == 3 else int(facts.get("largest_param") or 0)
    overlap = stage == 3 if buckets.overlap_comm is None else buckets.overlap_comm
    return StepSizes(unit=unit, bucket=bucket, staging_buffers=2 if overlap else 1,
                     gathered=stage3_gathered(training, buckets, unit) if stage == 3 else 0)


def compare(facts: dict[str, Any]) -> tuple[list[Comparison], PhysicalPeak | None, list[str]]:
    """The per-term comparison for a trial's facts, the physical peak against the estimate, and notes."""
    notes = []
    stage, world, psi = int(facts["stage"]), int(facts["world_size"]), int(facts["num_parameters"])
    optimizer = _OPTIMIZERS.get(str(facts.get("optimizer")))
    if optimizer is None:
        notes.append(f"optimizer {facts.get('optimizer')!r}: its state is estimated as Adam's (8 bytes/param)")
        optimizer = Optimizer.ADAM
    dtype = Dtype(facts.get("dtype", "fp32"))
    known = set(Buckets.__dataclass_fields__)
    buckets = Buckets(**{k: v for k, v in (facts.get("buckets") or {}).items() if k in known})
    placement = Placement(stage, Offload(facts.get("offload_optimizer", "none")), Offload(facts.get("offload_param", "none")))
    training = Training(psi, world, dtype, optimizer)
    flight = in_flight(training, placement, _sizes(facts, training, stage, buckets))
    estimated = engine_breakdown(stage, dtype, optimizer, world, psi, buffers=sum(flight.held.values()))
    measured = facts["memory_breakdown"]
    if stage == 3:
        notes.append("stage 3: parameters gathered when the steps ended are part of the bookkeeping params")
    rows = [Comparison(term, int(estimated[term]), int(measured.get(term, 0))) for term in TERMS]
    rows.append(Comparison("in_flight", flight.peak - sum(flight.held.values()), 0))  # the engine does not count it
    if facts.get("shared_memory_lane"):  # gloo ranks of one host: the lane's mapped pages are resident too
        rows.append(Comparison("transport", lane_bytes(4 * int(facts.get("largest_bucket") or 0), world), 0))
        notes.append("transport: the shared-memory lane of this host's ranks, mapped by every rank")
    peaks = [step_peak(figures) for figures in facts.get("physical_per_rank") or []]
    if peaks and None not in peaks and peaks[0][0].startswith("host"):  # type: ignore[index]
        rows.extend(host_rows(facts, stage, dtype))
        notes.append("host: the runtime every CPU rank holds and what glibc keeps free within a step are rows "
                     "of their own (host_runtime, allocator_retention)")
    rows.append(Comparison("total", sum(r.estimated for r in rows), sum(r.measured for r in rows)))
    if not peaks or None in peaks:
        notes.append("no physical figures on this platform: only the bookkeeping is compared")
        return rows, None, notes
    physical = PhysicalPeak(peaks[0][0], [p[1] for p in peaks], rows[-1].estimated)  # type: ignore[index]
    if physical.kind.startswith("host"):
        notes.append("physical (CPU): the RSS high-water mark after warm-up less the RSS when zerorun was imported; "
                     "it also holds the script's data and activations (not estimated here)")
    return rows, physical, notes


def host_rows(facts: dict[str, Any], stage: int, dtype: Dtype) -> list[Comparison]:
    """A CPU rank's terms beside the engine's: the runtime and the allocator's retention. The largest
    buffer a step frees is a parameter's gradient, or at stage 3 a gathered unit (``largest_bucket``),
    which stage 3 frees beside the gradients."""
    largest = max(int(facts.get("largest_param") or 0), int(facts.get("largest_bucket") or 0) if stage == 3 else 0)
    env = facts.get("allocator_env")
    env = env if isinstance(env, dict) else {}  # a rank's report: anything that is no mapping reads as none
    return [Comparison("host_runtime", HOST_RUNTIME, 0),
            Comparison("allocator_retention", allocator_retention(largest * dtype.nbytes, env, 2 if stage == 3 else 1),
                       0)]


def against_ddp(facts: dict[str, Any]) -> str | None:
    """One line for the end of a run: what the worse rank held physically, and the estimate of plain
    data parallel on the same model (this run's peak with DDP's model states and in-flight terms in
    place of this stage's: same runtime, same data). None without physical figures."""
    from zerorun.estimate.counts import human_bytes

    rows, physical, _ = compare(facts)
    if physical is None:
        return None
    ddp, _, _ = compare({**facts, "stage": 0, "offload_optimizer": "none", "offload_param": "none"})
    ddp_peak = physical.peak - rows[-1].estimated + ddp[-1].estimated
    return (f"peak {human_bytes(physical.peak)} per rank (physical, stage {facts['stage']}), "
            f"DDP on this model: ~{human_bytes(ddp_peak)} (estimate)")
