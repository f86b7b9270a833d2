"""Estimated against measured, term by term: what ``zerorun estimate --measure`` prints.

The measurement is a short run of the user's script under the bundled engine (the
autotune trial mechanism: ``ZERORUN_TRIAL_*`` variables, a JSON result); its
``facts`` carry ``engine.memory_breakdown()`` after the steps and the config the
engine really ran. The estimate here is computed for that same config, so any
ratio far from 1 is the estimate's error, not a different setup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerorun.estimate.buffers import Buckets, buffer_terms
from zerorun.estimate.model_states import Dtype, Offload, Optimizer, Placement, Training, engine_breakdown

TERMS = ("params", "gradients", "master_params", "optimizer_states", "buffers")
_OPTIMIZERS = {"adam": Optimizer.ADAM, "adamw": Optimizer.ADAMW, "sgd": Optimizer.SGD,
               "sgd-nomomentum": Optimizer.SGD_NO_MOMENTUM}


@dataclass(frozen=True)
class Comparison:
    """One term: the estimate, the engine's figure and measured / estimated."""

    term: str
    estimated: int
    measured: int

    @property
    def ratio(self) -> float | None:
        return None if self.estimated == 0 else self.measured / self.estimated

    def to_json(self) -> dict[str, Any]:
        return {"term": self.term, "estimated_bytes": self.estimated, "measured_bytes": self.measured,
                "ratio": self.ratio}


def compare(facts: dict[str, Any]) -> tuple[list[Comparison], list[str]]:
    """The per-term comparison for a trial's facts, and notes on what was assumed."""
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
    buffers = sum(buffer_terms(Training(psi, world, dtype, optimizer), placement, buckets, None).values())
    estimated = engine_breakdown(stage, dtype, optimizer, world, psi, buffers=buffers)
    measured = facts["memory_breakdown"]
    if stage == 3:
        notes.append("stage 3: parameters gathered when the steps ended are part of the measured params")
    rows = [Comparison(term, int(estimated[term]), int(measured.get(term, 0))) for term in TERMS]
    rows.append(Comparison("total", sum(r.estimated for r in rows), sum(r.measured for r in rows)))
    return rows, notes
