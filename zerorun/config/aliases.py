"""Deprecated and alternative key names that real configs still use.

Each is rewritten to the current key with a warning that names the new key. Giving
both the old and the new name is an error (which one wins would be a guess).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zerorun.config.problems import Problem, Severity

# old path -> new path; the value moves unchanged.
RENAMED: dict[str, str] = {
    "bfloat16": "bf16",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.gather_16bit_weights_on_model_save": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.prefetch_bucket_size": "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.param_persistence_threshold": "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.model_persistence_threshold": "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.max_live_parameters": "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.max_reuse_distance": "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.zero_allow_untested_optimizer": "zero_allow_untested_optimizer",
    "aio.intra_op_parallelism": "aio.thread_count",
}

# old path -> (new path, function old value -> new value or None to drop it)
CONVERTED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "zero_optimization.cpu_offload": (
        "zero_optimization.offload_optimizer.device",
        lambda v: "cpu" if v is True else None,
    ),
    "zero_optimization.cpu_offload_param": (
        "zero_optimization.offload_param.device",
        lambda v: "cpu" if v is True else None,
    ),
    "zero_optimization.cpu_offload_params": (
        "zero_optimization.offload_param.device",
        lambda v: "cpu" if v is True else None,
    ),
    "fp32_allreduce": ("communication_data_type", lambda v: "fp32" if v is True else None),
}

# one old key that fans out to several new keys
PIN_MEMORY = "zero_optimization.cpu_offload_use_pin_memory"
PIN_MEMORY_TARGETS = (
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
)

ALIASES: tuple[str, ...] = (*RENAMED, *CONVERTED, PIN_MEMORY, "zero_optimization (true/false)")
"""Every accepted old name, for documentation."""


@dataclass
class Rewritten:
    """The raw config with old names replaced, the problems found, and new path -> old path."""

    data: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)


def _pop(data: dict[str, Any], path: str) -> tuple[bool, Any]:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False, None
    return True, node.pop(last)


def _put(data: dict[str, Any], path: str, value: Any) -> bool:
    """Set ``path`` unless it is already there (returns False then) or a parent is not a mapping."""
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        if not isinstance(node, dict):
            return True  # the schema check reports the non-mapping parent
        node = node.setdefault(part, {})
    if not isinstance(node, dict):
        return True
    if last in node:
        return False
    node[last] = value
    return True


def _move(out: Rewritten, old: str, new: str, value: Any, use: str) -> None:
    if value is None:
        out.problems.append(
            Problem(
                old,
                f"is deprecated and has no effect with this value; remove it (the new key is {new})",
                severity=Severity.WARNING,
            )
        )
        return
    if not _put(out.data, new, value):
        out.problems.append(Problem(old, f"is the deprecated name of {new}; give only {new}"))
        return
    out.renamed[new] = old
    out.problems.append(Problem(old, f"is deprecated; use {use}", severity=Severity.WARNING))


def rewrite(data: dict[str, Any]) -> Rewritten:
    """Replace every old key in ``data`` (a fresh copy the caller owns) by its new key."""
    out = Rewritten(data)
    zero = data.get("zero_optimization")
    if isinstance(zero, bool):
        data["zero_optimization"] = {"stage": 1 if zero else 0}
        out.renamed["zero_optimization.stage"] = "zero_optimization"
        out.problems.append(
            Problem(
                "zero_optimization",
                f"true/false is deprecated; use zero_optimization: {{stage: {1 if zero else 0}}}",
                severity=Severity.WARNING,
            )
        )
    for old, new in RENAMED.items():
        found, value = _pop(data, old)
        if found:
            _move(out, old, new, value, new)
    for old, (new, convert) in CONVERTED.items():
        found, value = _pop(data, old)
        if found:
            _move(out, old, new, convert(value), f"{new}: {convert(value)}")
    found, value = _pop(data, PIN_MEMORY)
    if found:
        for target in PIN_MEMORY_TARGETS:
            if not _put(out.data, target, value):
                out.problems.append(
                    Problem(PIN_MEMORY, f"is the deprecated name of {target}; give only {target}")
                )
            else:
                out.renamed[target] = PIN_MEMORY
        use = " and ".join(PIN_MEMORY_TARGETS)
        out.problems.append(Problem(PIN_MEMORY, f"is deprecated; use {use}", severity=Severity.WARNING))
    return out
