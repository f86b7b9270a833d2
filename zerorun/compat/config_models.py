"""DeepSpeed's config models: ``DeepSpeedConfigModel`` (``deepspeed.runtime.config_utils``) and
``DeepSpeedZeroConfig`` (``deepspeed.runtime.zero.config``), which accelerate and other tools build.

``DeepSpeedConfigModel`` is the pydantic base DeepSpeed documents: unknown keys are
errors, fields fill by name or alias, ``"auto"`` values fall back to the default unless
``strict``, and a field marked ``json_schema_extra={"deprecated": True, "new_param": ...}``
moves its value (through ``new_param_fn``) to its replacement; giving both is an
``AssertionError``, as in DeepSpeed.

``DeepSpeedZeroConfig(**block)`` reads a ``zero_optimization`` block the way the engine
does - zerorun's schema, its old-name rewrites (``cpu_offload``, ``stage3_gather_fp16_...``)
and its errors - and answers DeepSpeed's attribute names (``prefetch_bucket_size`` for
``stage3_prefetch_bucket_size``, ``overlap_comm`` resolved by the stage, an offload block
that was not given is None).
"""

from __future__ import annotations

import copy
import logging
from functools import reduce
from typing import Any

from pydantic import BaseModel, ConfigDict

from zerorun.config.aliases import rewrite
from zerorun.config.problems import ConfigError, Severity
from zerorun.config.read import DICT_ORIGIN
from zerorun.config.schema_zero import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig

log = logging.getLogger("zerorun.compat")


class DeepSpeedConfigModel(BaseModel):
    """DeepSpeed's base for config models (see the module docstring for the contract)."""

    model_config = ConfigDict(validate_default=True, validate_assignment=True, use_enum_values=True,
                              populate_by_name=True, extra="forbid", arbitrary_types_allowed=True,
                              protected_namespaces=())

    def __init__(self, strict: bool = False, **data: Any) -> None:
        if not strict:  # DeepSpeed: "auto" means the default here (Hugging Face fills it in later)
            data = {k: v for k, v in data.items() if v != "auto" or k == "replace_method"}
        super().__init__(**data)
        for name, info in type(self).model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and extra.get("deprecated") and name in self.model_fields_set:
                self._move_deprecated(name, extra)

    def _move_deprecated(self, name: str, extra: dict[str, Any]) -> None:
        new = str(extra.get("new_param", ""))
        log.warning("Config parameter %s is deprecated%s", name, f" use {new} instead" if new else "")
        if not new or not extra.get("set_new_param", True):
            return
        convert = extra.get("new_param_fn", lambda x: x)
        value = convert(getattr(self, name))
        *parents, leaf = new.split(".")
        target = reduce(getattr, parents, self)
        assert leaf not in target.model_fields_set, (
            f"Cannot provide deprecated parameter '{name}' and replacing parameter '{new}' together")
        setattr(target, leaf, value)


_RENAMED = {name: f"stage3_{name}" for name in ("prefetch_bucket_size", "param_persistence_threshold",
                                                 "model_persistence_threshold", "max_live_parameters",
                                                 "max_reuse_distance", "gather_16bit_weights_on_model_save",
                                                 "module_granularity_threshold")}
_OFFLOADS = {"offload_param": ("cpu_offload_param", "cpu_offload_params"), "offload_optimizer": ("cpu_offload",)}


class DeepSpeedZeroConfig:
    """A ``zero_optimization`` block, validated by zerorun's schema, with DeepSpeed's attribute names."""

    def __init__(self, **data: Any) -> None:
        block = copy.deepcopy(data)
        given = {n for n, old in _OFFLOADS.items() if block.get(n) is not None or any(block.get(o) for o in old)}
        for name in _OFFLOADS:
            if block.get(name) is None:
                block.pop(name, None)
        rewritten = rewrite({"zero_optimization": block})  # the old names the engine accepts, with its errors
        errors = [p for p in rewritten.problems if p.severity is Severity.ERROR]
        if errors:
            raise ConfigError(DICT_ORIGIN, errors)
        self._block = ZeroConfig(**rewritten.data["zero_optimization"])  # pydantic's ValidationError, as DeepSpeed
        self._given = given
        if int(self._block.stage) == 3 and self._block.elastic_checkpoint:  # DeepSpeed's words, on its logger
            logging.getLogger("DeepSpeed").warning("ZeRO-3 elastic checkpointing is deprecated and no longer "
                                                   "supported. Use Universal Checkpointing instead.")

    @property
    def overlap_comm(self) -> bool:
        """Unset: true at stage 3, false below (DeepSpeed's default)."""
        value = self._block.overlap_comm
        return int(self._block.stage) == 3 if value is None else bool(value)

    @property
    def offload_param(self) -> OffloadParamConfig | None:
        return self._block.offload_param if "offload_param" in self._given else None

    @property
    def offload_optimizer(self) -> OffloadOptimizerConfig | None:
        return self._block.offload_optimizer if "offload_optimizer" in self._given else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._block, _RENAMED.get(name, name))

    def model_dump(self) -> dict[str, Any]:
        return self._block.model_dump()


DeepSpeedZeroOffloadParamConfig = OffloadParamConfig
DeepSpeedZeroOffloadOptimizerConfig = OffloadOptimizerConfig

__all__ = ["DeepSpeedConfigModel", "DeepSpeedZeroConfig", "DeepSpeedZeroOffloadOptimizerConfig",
           "DeepSpeedZeroOffloadParamConfig"]
