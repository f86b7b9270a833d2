"""Model-state bytes per parameter as ``aΨ + bΨ/N``: each master mode at each stage (pure arithmetic).

``a`` is what every rank holds whole, ``b`` what the ranks share (a 1/N shard each), read off
:func:`model_states` itself (two worlds of one model, so the formula cannot drift from the rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.estimate.model_states import Dtype, Masters, Optimizer, Placement, Training, model_states

_PSI = 1 << 20  # divisible by both worlds: no padding in the shards


@dataclass(frozen=True)
class PerParam:
    """Bytes per parameter of one stage and mode: ``replicated`` Ψ + ``sharded`` Ψ/N."""

    stage: int
    masters: Masters
    replicated: float
    sharded: float

    def formula(self) -> str:
        parts = [f"{_num(self.replicated)}Ψ" if self.replicated else "", f"{_num(self.sharded)}Ψ/N" if self.sharded else ""]
        return " + ".join(p for p in parts if p) or "0"

    def at(self, world_size: int) -> float:
        return self.replicated + self.sharded / world_size


def _num(x: float) -> str:
    return f"{x:g}"


def per_param(stage: int, masters: Masters, dtype: Dtype = Dtype.BF16,
              optimizer: Optimizer = Optimizer.ADAM) -> PerParam:
    """The formula of ``stage`` with ``masters`` (the engine's layout, no offload)."""
    one, two = (model_states(Training(_PSI, n, dtype, optimizer, masters=masters), Placement(stage)).total / _PSI
                for n in (1, 2))
    sharded = 2 * (one - two)
    return PerParam(stage, masters, one - sharded, sharded)


def modes_for(dtype: Dtype) -> list[Masters]:
    """The master modes a compute dtype can have: bf16 masters only over bf16 compute."""
    return list(Masters) if dtype is Dtype.BF16 else [Masters.FP32]


def stages_for(masters: Masters) -> list[int]:
    """bf16 masters need stage 1-3 (as in DeepSpeed)."""
    return [1, 2, 3] if masters.low else [0, 1, 2, 3]


def table(dtype: Dtype, optimizer: Optimizer) -> dict[Masters, list[PerParam]]:
    """Every mode's formula at every stage it runs."""
    return {m: [per_param(s, m, dtype, optimizer) for s in stages_for(m)] for m in modes_for(dtype)}
