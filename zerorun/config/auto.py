"""Resolving ``"auto"`` values, as Hugging Face configs write them.

Only what zerorun can know is resolved: the batch keys from each other and the world
size (done by ``batch.py``), and three bucket sizes from the model's hidden size
(the formulas of transformers/accelerate). Values that Hugging Face's Trainer fills
from its own arguments (learning rate, fp16 ...) have no such source here: they take
the default and a note says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zerorun.config.problems import Problem, Severity
from zerorun.config.schema import BATCH_KEYS

AUTO = "auto"

HIDDEN_SIZE_AUTO: dict[str, tuple[str, Callable[[int], int]]] = {
    "zero_optimization.reduce_bucket_size": ("hidden_size^2", lambda h: h * h),
    "zero_optimization.stage3_prefetch_bucket_size": ("int(0.9 * hidden_size^2)", lambda h: int(0.9 * h * h)),
    "zero_optimization.stage3_param_persistence_threshold": ("10 * hidden_size", lambda h: 10 * h),
}
"""Keys resolved from the model's hidden size: (formula, function)."""

DEFAULTED_AUTO = (
    "gradient_clipping",
    "fp16.enabled",
    "bf16.enabled",
    "amp.enabled",
    "amp.opt_level",
    "checkpoint.use_node_local_storage",
)
"""Keys a trainer fills in; without one they take their default."""

FREE_FORM_AUTO = ("optimizer.params", "scheduler.params")
"""Mappings whose "auto" entries are dropped, so the optimizer's own default applies."""


@dataclass
class Resolved:
    """The config with "auto" replaced, the notes, and path -> how it was resolved."""

    data: dict[str, Any]
    notes: list[Problem] = field(default_factory=list)
    resolved: dict[str, str] = field(default_factory=dict)
    batch_auto: list[str] = field(default_factory=list)


def _node(data: dict[str, Any], path: str) -> tuple[dict[str, Any] | None, str]:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), last


def resolve_auto(data: dict[str, Any], *, hidden_size: int | None) -> Resolved:
    """Replace the "auto" values of ``data`` (a copy the caller owns) that can be resolved.

    Batch keys are removed (they are then derived from the others, see ``batch.py``);
    hidden-size keys get their formula's value, or are removed (the default applies)
    when the hidden size is not known. Any other "auto" stays and fails validation.
    """
    out = Resolved(data)
    for key in BATCH_KEYS:
        if data.get(key) == AUTO:
            del data[key]
            out.batch_auto.append(key)
    for path, (formula, compute) in HIDDEN_SIZE_AUTO.items():
        node, last = _node(data, path)
        if node is None or node.get(last) != AUTO:
            continue
        if hidden_size is None:
            del node[last]
            out.resolved[path] = f"{formula} at run time; default until the hidden size is known"
        else:
            node[last] = compute(hidden_size)
            out.resolved[path] = f"{formula}, hidden_size={hidden_size}"
    pending = [path for path, how in out.resolved.items() if how.endswith("hidden size is known")]
    if pending:
        message = '"auto" is resolved at run time from the model\'s hidden size (until then: the defaults)'
        out.notes.append(Problem(", ".join(pending), message, severity=Severity.NOTE))
    for path in DEFAULTED_AUTO:
        node, last = _node(data, path)
        if node is not None and node.get(last) == AUTO:
            del node[last]
            out.resolved[path] = "nothing to resolve it from; the default"
            out.notes.append(
                Problem(
                    path, '"auto" has no trainer to fill it in; the default is used', severity=Severity.NOTE
                )
            )
    for path in FREE_FORM_AUTO:
        node, last = _node(data, path)
        params = node.get(last) if node is not None else None
        if isinstance(params, dict):
            dropped = [name for name, value in params.items() if value == AUTO]
            for name in dropped:
                del params[name]
            if dropped:
                kind = path.split(".")[0]
                message = f'"auto" dropped for {", ".join(dropped)}; the {kind}\'s own defaults apply'
                out.notes.append(Problem(path, message, severity=Severity.NOTE))
    return out
