"""Drive the real engine as rank r of N on the fake group: set-up, K steps, and every figure it reports.

The recipe is a user's: ``zero.Init`` around the model's construction (on the meta
device in meta mode, so nothing is ever allocated), ``zerorun.initialize``, then
forward / backward / step K times. Each phase is timed and, on the CPU, measured by
the kernel (:mod:`zerorun.simulate.peak`); the engine's own bookkeeping
(``memory_breakdown()``, the collective counters, the gather coordinator's live window)
is read after it. :mod:`zerorun.simulate.compare` sets these beside the estimate.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zerorun.engine.comm.counter import KINDS
from zerorun.engine.metrics import MEMORY_KEYS
from zerorun.estimate.shape import ModelShape
from zerorun.simulate import Simulation, world
from zerorun.simulate.host import host_stand_in
from zerorun.simulate.peak import measured, return_freed_memory
from zerorun.simulate.resident import ResidentPeak

RESIDENT_SAMPLES = 64  # about this many looks at the resident bytes per backward (two collectives a bucket)
PHASES = ("setup", "forward", "backward", "step")
Counts = dict[str, dict[str, int]]  # kind -> {"calls", "bytes", "elements"}


@dataclass(frozen=True)
class ModelChoice:
    """What to build: ``build()`` returns a module whose ``forward(tokens)`` is the loss."""

    label: str
    shape: ModelShape | None
    vocab: int
    build: Callable[[], nn.Module]


@dataclass(frozen=True)
class SimRequest:
    simulation: Simulation
    model: ModelChoice
    config: dict[str, Any]  # DeepSpeed keys; the batch keys resolve for the simulated world
    steps: int = 2
    seq_len: int = 16
    resident: bool = True  # on meta: sample the bytes resident on each side (a walk of the engine's objects a look)


@dataclass
class PhaseFigures:
    """A phase's slowest run (over the steps) and its highest resident peak (CPU mode)."""

    seconds: float = 0.0
    rss_start: int | None = None
    rss_peak: int | None = None

    def add(self, seconds: float, start: int | None, peak: int | None) -> None:
        self.seconds = max(self.seconds, seconds)
        if peak is not None and (self.rss_peak is None or peak > self.rss_peak):
            self.rss_start, self.rss_peak = start, peak


@dataclass
class SimResult:
    """Everything one simulated rank reported (bytes and elements are per rank)."""

    world_size: int
    rank: int
    device: str
    model: str
    stage: int
    dtype: str
    optimizer: str | None
    psi: int  # trainable parameters, no padding
    buckets: int
    padding_numel: int  # elements the buckets add to Ψ (shard and slot alignment)
    persistent_numel: int  # stage 3: elements of the buckets kept gathered (padding included)
    setup: Counts  # zero.Init and initialize, before the first step
    steps: list[Counts]
    step_phases: list[dict[str, Counts]]  # per step: the forward, backward and step phases' own traffic
    memory: dict[str, int]  # memory_breakdown() after the last step
    forward_params: int  # memory_breakdown()["params"] when the last forward ended
    kept_numel: int | None  # stage 3: non-persistent elements still gathered when the last forward ended
    peak_live_numel: int | None  # stage 3: the coordinator's most gathered at once
    phases: dict[str, PhaseFigures] = field(default_factory=dict)
    seconds: float = 0.0
    # meta only (on the CPU host and device are one memory): the most model state seen on each side, activations
    # excluded (zerorun.simulate.resident)
    device_model_state_peak: int | None = None
    host_peak: int | None = None


def _counts(snapshot: dict[str, dict[str, int | str]]) -> Counts:
    return {k: {f: int(snapshot[k][f]) for f in ("calls", "bytes", "elements")} for k in KINDS}


def _minus(after: Counts, before: Counts) -> Counts:
    return {k: {f: after[k][f] - before[k][f] for f in after[k]} for k in KINDS}


def _plus(a: Counts, b: Counts) -> Counts:
    return {k: {f: a[k][f] + b[k][f] for f in a[k]} for k in KINDS}


def _zero_counts() -> Counts:
    return {k: {"calls": 0, "bytes": 0, "elements": 0} for k in KINDS}


def _build(req: SimRequest) -> tuple[nn.Module, Counts]:
    """The model under ``zero.Init`` (meta construction in meta mode) and the traffic it cost."""
    from zerorun import zero

    device = torch.device("meta") if req.simulation.device == "meta" else contextlib.nullcontext()
    with device, zero.Init(config=req.config) as init:
        module = req.model.build()
    return module, _counts(init.coll.counter.snapshot()) if init.coll is not None else _zero_counts()


def _stage3_figures(engine: Any) -> tuple[int | None, int | None, int]:
    coordinator = getattr(engine.parts, "coordinator", None)
    if coordinator is None:
        return None, None, 0
    persistent = sum(b.plan.padded_numel for b in coordinator.buckets if b.persistent)
    return coordinator.live_numel(), coordinator.stats.peak_live_numel, persistent


def _bookkeeping(engine: Any) -> dict[str, int]:
    """The model-state terms of ``memory_breakdown()`` (the physical figures are the phases' peaks)."""
    memory = engine.memory_breakdown()
    return {k: memory[k] for k in MEMORY_KEYS}


def run(req: SimRequest) -> SimResult:
    """Set up and run ``req.steps`` steps as ``req.simulation.rank`` of ``req.simulation.world_size``."""
    import zerorun

    sim, cpu = req.simulation, req.simulation.device == "cpu"
    if cpu:
        return_freed_memory()  # the peaks are then the engine's, not glibc's retention
    phases = {name: PhaseFigures() for name in PHASES}
    began = time.perf_counter()
    with world(sim.world_size, sim.rank, sim.device), host_stand_in(sim.device == "meta"):
        torch.manual_seed(0)
        with measured(cpu) as peak:
            t0 = time.perf_counter()
            module, init_traffic = _build(req)
            engine, _, _, _ = zerorun.initialize(model=module, model_parameters=module.parameters(),
                                                 config=req.config)
        phases["setup"].add(time.perf_counter() - t0, peak.start, peak.peak)
        if not cpu:
            _unfuse(engine.optimizer)
        setup = _plus(init_traffic, _counts(engine.comm_stats()))
        tokens = torch.zeros(engine.train_micro_batch_size_per_gpu(), req.seq_len, dtype=torch.long,
                             device=engine.device)
        steps, step_phases, forward_params, kept = [], [], 0, None
        resident = ResidentPeak(engine, lambda: sum(int(c["calls"]) for c in engine.comm_stats().values()),
                                stride=len(engine.parts.buckets) // RESIDENT_SAMPLES)
        sampled = not cpu and req.resident
        watch = resident.watching_backward if sampled else contextlib.nullcontext
        look = resident.sample if sampled else _nothing
        look()
        handles = resident.watch_gradients(list(module.parameters())) if sampled else []
        for _ in range(req.steps):
            marks = [_counts(engine.comm_stats())]
            with watch():
                loss = _phase(phases["forward"], cpu, partial(engine, tokens))
            marks.append(_counts(engine.comm_stats()))
            forward_params, kept = engine.memory_breakdown()["params"], _stage3_figures(engine)[0]
            look()
            _phase(phases["backward"], cpu, partial(engine.backward, loss))
            look()
            marks.append(_counts(engine.comm_stats()))
            _phase(phases["step"], cpu, engine.step)
            look()
            marks.append(_counts(engine.comm_stats()))
            steps.append(_minus(marks[-1], marks[0]))
            step_phases.append({name: _minus(marks[i + 1], marks[i]) for i, name in enumerate(PHASES[1:])})
        for handle in handles:
            handle.remove()
        cfg = engine.config
        _, peak_live, persistent = _stage3_figures(engine)
        return SimResult(
            world_size=sim.world_size, rank=sim.rank, device=sim.device, model=req.model.label,
            stage=engine.zero_stage, dtype=engine.precision.name, optimizer=_optimizer_name(cfg),
            psi=engine.num_parameters(), buckets=len(engine.parts.buckets),
            padding_numel=sum(b.plan.padded_numel - b.plan.numel for b in engine.parts.buckets),
            persistent_numel=persistent,
            setup=setup, steps=steps, step_phases=step_phases, memory=_bookkeeping(engine), forward_params=forward_params,
            kept_numel=kept, peak_live_numel=peak_live, phases=phases, seconds=time.perf_counter() - began,
            device_model_state_peak=resident.device if sampled else None, host_peak=resident.host if sampled else None)


def _nothing() -> None:
    pass


def _unfuse(optimizer: Any) -> None:
    """The for-loop kernel for a host step on meta: torch's fused kernel checks for a real CPU tensor
    (the step's temporaries live in host memory either way, never on the device)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    for group in [*getattr(inner, "param_groups", []), getattr(inner, "defaults", {})]:
        if group.get("fused"):
            group["fused"], group["foreach"] = False, False


def _phase(figures: PhaseFigures, cpu: bool, fn: Callable[[], Any]) -> Any:
    with measured(cpu) as peak:
        t0 = time.perf_counter()
        out = fn()
    figures.add(time.perf_counter() - t0, peak.start, peak.peak)
    return out


def _optimizer_name(cfg: Any) -> str | None:
    opt = getattr(cfg, "optimizer", None)
    return None if opt is None else str(opt.type).lower()


def default_config(stage: int, dtype: str = "bf16") -> dict[str, Any]:
    """The config a simulation runs without ``--config``: AdamW, one sample per rank, ``dtype``."""
    return {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"},
            "zero_optimization": {"stage": stage}}


def config_with_stage(source: Path | None, stage: int | None) -> dict[str, Any]:
    """The user's config (or :func:`default_config`) as a dict, its stage replaced by ``stage`` when given."""
    if source is None:
        return default_config(3 if stage is None else stage)
    from zerorun.config.read import read_source

    raw, _ = read_source(source)
    cfg = dict(raw)
    if stage is not None:
        cfg["zero_optimization"] = {**cfg.get("zero_optimization", {}), "stage": stage}
    return cfg
