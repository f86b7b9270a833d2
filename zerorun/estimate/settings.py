"""The settings of one estimate row as config keys: what ``print-config`` writes and ``next:`` names.

An estimate row is a stage, an offload choice, the dtype, the optimizer, the masters and a micro
batch; :class:`Settings` holds those (None: keep what the base config says), turns them into
DeepSpeed's keys on top of a base config (:meth:`Settings.apply`) and into the ``print-config``
flags that do the same (:meth:`Settings.flags`), so the ``next:`` line after a recommendation
writes a config that gives the recommended row, bucket sizes included: they come from the
estimate's ``--config`` when it had one (it is the base), else from the defaults that an
estimate without ``--config`` assumed too. Pure data, no torch.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, fields
from typing import Any

from zerorun.estimate.model_states import Dtype, Masters, Offload, Optimizer, Placement

DEFAULT_NVME_PATH = "/local_nvme"
_OPTIMIZER_TYPE = {Optimizer.ADAM: "Adam", Optimizer.ADAMW: "AdamW", Optimizer.SGD: "SGD",
                   Optimizer.SGD_NO_MOMENTUM: "SGD"}
_COMPENSATION = {Masters.BF16_KAHAN: "kahan", Masters.BF16_STOCHASTIC: "stochastic_rounding"}


def base_config() -> dict[str, Any]:
    """The config ``print-config`` starts from without a FILE or template: the estimate's own defaults."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 0}}


@dataclass(frozen=True)
class Settings:
    """A row's settings; a field left None keeps the base config's value."""

    stage: int | None = None
    offload_optimizer: Offload | None = None
    offload_param: Offload | None = None
    offload_ratio: float | None = None
    dtype: Dtype | None = None
    optimizer: Optimizer | None = None
    masters: Masters | None = None
    micro_batch: int | None = None
    nvme_path: str | None = None

    @classmethod
    def of_row(cls, placement: Placement, dtype: Dtype, optimizer: Optimizer, masters: Masters,
               micro_batch: int) -> Settings:
        """Every setting of an estimate row (``placement``) trained as ``dtype`` / ``optimizer`` / ``masters``."""
        nvme = Offload.NVME in (placement.offload_optimizer, placement.offload_param)
        return cls(placement.stage, placement.offload_optimizer, placement.offload_param,
                   placement.offload_ratio if placement.offload_ratio < 1.0 else None, dtype, optimizer, masters,
                   micro_batch, DEFAULT_NVME_PATH if nvme else None)

    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def flags(self) -> list[str]:
        """The ``print-config`` flags that apply these settings."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                text = value.value if hasattr(value, "value") else f"{value:g}" if isinstance(value, float) else value
                out += [f"--{f.name.replace('_', '-')}", str(text)]
        return out

    def command(self, base: str | None, output: str = "ds_config.yaml") -> str:
        """The ``print-config`` command that writes these settings on ``base`` (a config file, or the defaults)."""
        words = ["zerorun", "print-config", *([base] if base else []), *self.flags(), "-o", output]
        return shlex.join(words)

    def apply(self, base: dict[str, Any]) -> dict[str, Any]:
        """``base`` (DeepSpeed keys) with these settings written in; ``base`` itself is left unchanged."""
        cfg = copy.deepcopy(base)
        if self.micro_batch is not None:
            cfg["train_micro_batch_size_per_gpu"] = self.micro_batch
            cfg.pop("train_batch_size", None)  # derived again from the micro batch
        if self.optimizer is not None:
            _set_optimizer(cfg, self.optimizer)
        if self.dtype is not None:
            cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": self.dtype is Dtype.BF16}
            cfg["fp16"] = {**cfg.get("fp16", {}), "enabled": self.dtype is Dtype.FP16}
        if self.masters is not None:
            _set_masters(cfg, self.masters)
        zero = cfg.setdefault("zero_optimization", {})
        if self.stage is not None:
            zero["stage"] = self.stage
        for key, device in (("offload_optimizer", self.offload_optimizer), ("offload_param", self.offload_param)):
            if device is not None:
                _set_offload(zero, key, device, self.nvme_path)
        if self.offload_ratio is not None and isinstance(zero.get("offload_optimizer"), dict):
            zero["offload_optimizer"]["ratio"] = self.offload_ratio
        return cfg


def _set_optimizer(cfg: dict[str, Any], optimizer: Optimizer) -> None:
    kind = _OPTIMIZER_TYPE[optimizer]
    current = cfg.get("optimizer") or {}
    params = dict(current.get("params") or {"lr": 1e-4}) if str(current.get("type", "")).lower() == kind.lower() \
        else {"lr": 1e-4}
    if optimizer is Optimizer.SGD:
        params["momentum"] = params.get("momentum") or 0.9
    elif optimizer is Optimizer.SGD_NO_MOMENTUM:
        params.pop("momentum", None)
    cfg["optimizer"] = {**current, "type": kind, "params": params}


def _set_masters(cfg: dict[str, Any], masters: Masters) -> None:
    bf16 = {k: v for k, v in cfg.get("bf16", {}).items()
            if k not in ("bf16_master_weights_and_grads", "bf16_optimizer_states", "master_compensation")}
    if masters.low:
        bf16.update(enabled=True, bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
        if masters in _COMPENSATION:
            bf16["master_compensation"] = _COMPENSATION[masters]
    cfg["bf16"] = bf16


def _set_offload(zero: dict[str, Any], key: str, device: Offload, nvme_path: str | None) -> None:
    if device is Offload.NONE:
        zero.pop(key, None)
        return
    block = {k: v for k, v in (zero.get(key) or {}).items() if device is Offload.NVME or k != "nvme_path"}
    block.update(device=device.value)
    block.setdefault("pin_memory", True)
    if device is Offload.NVME:
        block["nvme_path"] = nvme_path or block.get("nvme_path") or DEFAULT_NVME_PATH
    zero[key] = block
