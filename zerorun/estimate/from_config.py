"""What the estimate takes from a zerorun/DeepSpeed config: bucket sizes, dtype, optimizer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zerorun.errors import ZerorunError
from zerorun.estimate.buffers import Buckets
from zerorun.estimate.model_states import Dtype, Masters, Optimizer


@dataclass(frozen=True)
class ConfigFacts:
    """The parts of a resolved config that change the estimate (None: the config does not say)."""

    buckets: Buckets
    dtype: Dtype | None = None
    optimizer: Optimizer | None = None
    offload_ratio: float = 1.0  # offload_optimizer.ratio (Twin-Flow, stage 3)
    masters: Masters | None = None


def optimizer_of(cfg: Any) -> Optimizer | None:
    opt = getattr(cfg, "optimizer", None)
    if opt is None:
        return None
    kind = str(getattr(opt, "type", "")).lower()
    if kind in ("adam", "adamw", "fusedadam", "cpuadam"):
        return Optimizer.ADAMW if kind == "adamw" else Optimizer.ADAM
    if kind == "sgd":
        momentum = (getattr(opt, "params", None) or {}).get("momentum", 0)
        return Optimizer.SGD if momentum else Optimizer.SGD_NO_MOMENTUM
    return None  # unknown optimizer: the caller's default (Adam-sized) applies


def dtype_of(cfg: Any) -> Dtype:
    if getattr(getattr(cfg, "bf16", None), "enabled", False):
        return Dtype.BF16
    if getattr(getattr(cfg, "fp16", None), "enabled", False):
        return Dtype.FP16
    return Dtype.FP32


def masters_of(cfg: Any) -> Masters:
    """bf16.bf16_master_weights_and_grads (with its master_compensation), else fp32 masters."""
    bf16 = getattr(cfg, "bf16", None)
    if not (getattr(bf16, "enabled", False) and getattr(bf16, "bf16_master_weights_and_grads", False)):
        return Masters.FP32
    compensation = getattr(bf16, "master_compensation", "none")
    return {"kahan": Masters.BF16_KAHAN, "stochastic_rounding": Masters.BF16_STOCHASTIC}.get(compensation,
                                                                                            Masters.BF16)


def config_facts(path: str | Path | None, *, world_size: int, hidden_size: int | None) -> ConfigFacts:
    """Load ``path`` (None: zerorun's defaults) with "auto" resolved for this world and model.

    Raises the config's own ``ConfigError`` for a bad file. Without a path the dtype and
    optimizer are left to the command line.
    """
    try:
        from zerorun.config import load_config
    except ImportError:  # a checkout without the config package: DeepSpeed's defaults
        return ConfigFacts(Buckets())
    if path is None:
        try:
            cfg = load_config(None, world_size=world_size, hidden_size=hidden_size)
        except ZerorunError:  # the defaults need no batch keys to size buckets
            return ConfigFacts(Buckets())
        # overlap_comm left unset, so that every row gets its own stage's default
        return ConfigFacts(replace(Buckets.from_zero_config(cfg.zero_optimization), overlap_comm=None))
    cfg = load_config(str(path), world_size=world_size, hidden_size=hidden_size)
    buckets = Buckets.from_zero_config(cfg.zero_optimization)
    ratio = float(getattr(getattr(cfg.zero_optimization, "offload_optimizer", None), "ratio", 1.0))
    return ConfigFacts(buckets, dtype_of(cfg), optimizer_of(cfg), ratio, masters_of(cfg))
