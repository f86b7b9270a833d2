"""DeepSpeed top-level keys that zerorun does not implement, judged as DeepSpeed would use them.

A real ``ds_config.json`` should load when zerorun would train the same thing, and fail
with one error naming the feature when it would not:

* ``IGNORED``: logging, tooling or transport details; accepted with a "no effect" warning.
* ``FEATURES``: blocks that change what is trained. As in DeepSpeed they are off unless
  enabled (every one of their ``enabled`` flags defaults to false), so a disabled or
  empty block loads with a warning; an enabled one is an error naming the feature.
* ``MODULE_ONLY``: settings read only by DeepSpeed modules zerorun does not have
  (``deepspeed.pipe``, sparse attention), which fail on import themselves; a warning.
* ``EXACT``: keys whose DeepSpeed default is zerorun's behaviour; any other value errs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zerorun.config.problems import Problem, Severity

IGNORED = (
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "dump_state",
    "autotuning",
    "dataloader_drop_last",
    "timers",
    "nebula",
    "vocabulary_size",
    "disable_allgather",
    "sparse_gradients",  # the reduced values are the same; zerorun reduces them dense
    "use_data_before_expert_parallelism",
    "seq_parallel_communication_data_type",
    "cuda_visible_devices",  # not a DeepSpeed key (it ignores unknown top-level keys); seen in example configs
)
"""Accepted with a warning: they only affect logging, tooling or how values travel."""


def _enabled_anywhere(value: Any) -> bool:
    if isinstance(value, dict):
        return value.get("enabled") is True or any(_enabled_anywhere(v) for v in value.values())
    return False


def _size_above_one(*path: str) -> Callable[[Any], bool]:
    def on(value: Any) -> bool:
        for key in path:
            value = value.get(key, 0) if isinstance(value, dict) else 0
        return isinstance(value, (int, float)) and value > 1

    return on


FEATURES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "data_efficiency": ("data efficiency (curriculum sampling, random-LTD)", _enabled_anywhere),
    "curriculum_learning": ("curriculum learning", _enabled_anywhere),
    "compression_training": ("compression training", _enabled_anywhere),
    "hybrid_engine": ("hybrid (RLHF) engine", _enabled_anywhere),
    "quantize_training": ("quantization-aware training", _enabled_anywhere),
    "eigenvalue": ("eigenvalue computation", _enabled_anywhere),
    "progressive_layer_drop": ("progressive layer drop", _enabled_anywhere),
    "weight_quantization": ("weight quantization", _enabled_anywhere),
    "compile": ("DeepCompile", lambda v: isinstance(v, dict) and v.get("deepcompile") is True),
    "tensor_parallel": ("tensor parallelism (AutoTP)",
                        lambda v: _size_above_one("autotp_size")(v) or _size_above_one("tp", "tp_size")(v)),
    "sequence_parallel_size": ("sequence parallelism (Ulysses)", lambda v: isinstance(v, int) and v > 1),
    "moe": ("mixture of experts", lambda v: True),
    "zenflow": ("ZenFlow", lambda v: True),
}
"""Key -> (feature, is it on?): an error when on, a warning when off."""

TORCH_COMPILE_KEYS = ("enabled", "backend", "kwargs")
"""The ``compile`` block's keys the schema reads (DeepSpeed 0.13.2-0.14.3: torch.compile at initialize)."""

DEEPCOMPILE_KEYS = (
    "deepcompile", "free_activation", "free_activation_threshold", "offload_activation",
    "offload_activation_pin_memory", "offload_opt_states", "double_buffer", "symmetric_memory", "debug_log",
    "offload_parameters", "sync_before_reduce", "sync_after_reduce", "sync_before_allgather",
    "sync_after_allgather", "keep_int_input_tensors", "keep_all_input_tensors", "passes",
)
"""The ``compile`` block's DeepCompile keys (DeepSpeed >= 0.16's ``CompileConfig``): refused when
``deepcompile`` is true, ignored with a warning otherwise. Any other key reaches the schema, which
names it."""

MODULE_ONLY = {"pipeline": "deepspeed.pipe", "sparse_attention": "DeepSpeed's sparse attention modules"}

EXACT: dict[str, tuple[Any, str]] = {
    "managed_gradient_accumulation": (True, "the engine counts micro-steps to find the accumulation boundary"),
}


def _feature_problem(key: str, value: Any) -> Problem:
    feature, is_on = FEATURES[key]
    if not is_on(value):
        return Problem(key, f"is DeepSpeed's {feature}, which zerorun does not have (disabled here, so ignored)",
                       severity=Severity.WARNING)
    return Problem(key, f"enables DeepSpeed's {feature}, which zerorun does not implement; "
                        "remove the block or disable it")


def _data_types_problem(value: Any) -> Problem | None:
    """``data_types`` other than ``grad_accum_dtype`` (which the schema reads): ``buffer_dtype`` and the like."""
    read = ("grad_accum_dtype",)
    set_keys = ([k for k, v in value.items() if v is not None and k not in read] if isinstance(value, dict)
                else ["(the block)"])
    if not set_keys:
        return None
    return Problem(f"data_types.{set_keys[0]}", "is not supported: zerorun keeps gradients and parameters in the "
                                                "dtypes its precision block implies; remove it")


def _sum_conflicts(data: dict[str, Any]) -> list[Problem]:
    """``gradient_allreduce_op: sum`` with ZenFlow or DeepCompile, in DeepSpeed's words (it refuses both pairs;
    zerorun refuses the two features themselves too, below)."""
    op, zero, compiled = data.get("gradient_allreduce_op"), data.get("zero_optimization"), data.get("compile")
    if not (isinstance(op, str) and op.lower() == "sum"):
        return []
    problems = []
    if isinstance(zero, dict) and zero.get("zenflow") is not None:
        problems.append(Problem("gradient_allreduce_op", "'sum' is not supported with ZenFlow"))
    if FEATURES["compile"][1](compiled):
        problems.append(Problem("gradient_allreduce_op", "'sum' is not supported with DeepCompile"))
    return problems


def _split_compile(data: dict[str, Any]) -> list[Problem]:
    """The ``compile`` block: DeepCompile's keys out (an error if it is on, else a warning); the
    torch.compile keys (and any unknown key, for the schema to name) stay."""
    block = data.get("compile")
    if not isinstance(block, dict):
        return []  # absent, or not a block: the schema says so
    deep = {k: block[k] for k in block if k in DEEPCOMPILE_KEYS}
    rest = {k: v for k, v in block.items() if k not in DEEPCOMPILE_KEYS}
    if rest:
        data["compile"] = rest
    else:
        del data["compile"]
    return [_feature_problem("compile", deep)] if deep else []


def strip_compat(data: dict[str, Any]) -> list[Problem]:
    """Remove DeepSpeed-only keys from ``data`` (a copy the caller owns); report them."""
    problems = _sum_conflicts(data) + _split_compile(data)
    for key in IGNORED:
        if key in data:
            del data[key]
            problems.append(Problem(key, "is a DeepSpeed key that zerorun accepts but ignores",
                                    severity=Severity.WARNING))
    for key in FEATURES:
        if key in data and key != "compile":  # its DeepCompile keys are out already (_split_compile)
            problems.append(_feature_problem(key, data.pop(key)))
    for key, module in MODULE_ONLY.items():
        if key in data:
            del data[key]
            problems.append(Problem(key, f"is read only by {module}, which zerorun does not implement "
                                         "(importing it raises); ignored", severity=Severity.WARNING))
    for key, (wanted, why) in EXACT.items():
        if key in data and (value := data.pop(key)) != wanted:
            problems.append(Problem(key, f"{value!r} is not supported: {why} (DeepSpeed's default {wanted!r})"))
    if "data_types" in data and (problem := _data_types_problem(data["data_types"])) is not None:
        problems.append(problem)
        del data["data_types"]
    elif isinstance(data.get("data_types"), dict):  # grad_accum_dtype alone (or nothing set): the schema reads it
        data["data_types"] = {k: v for k, v in data["data_types"].items() if v is not None}
    return problems
