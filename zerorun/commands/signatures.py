"""``optimizer.params`` and ``scheduler.params`` against what ``initialize`` really calls.

The schema accepts any params dict (DeepSpeed's does too); the engine then calls the
``torch.optim`` class or the schedule with them, and a wrong name fails only on every
rank at start-up. ``validate`` reads the same classes' signatures first: an unknown
name gets a did-you-mean, a value of the wrong kind names the expected one.
"""

from __future__ import annotations

from typing import Any

from zerorun.config.builder_signatures import DROPPED, OPTIMIZERS, SCHEDULES
from zerorun.config.problems import Problem
from zerorun.config.schema import ZerorunConfig
from zerorun.config.suggest import did_you_mean


def _kind(default: Any) -> tuple[type, ...] | None:
    """The value kinds a parameter with ``default`` takes (None: anything)."""
    if isinstance(default, bool):
        return (bool,)
    if isinstance(default, (int, float)):
        return (int, float)
    if isinstance(default, (tuple, list)):
        return (tuple, list)
    if isinstance(default, str):
        return (str,)
    return None


PER_GROUP = frozenset({"warmup_min_lr", "warmup_max_lr", "cycle_min_lr", "cycle_max_lr", "cycle_min_mom",
                       "cycle_max_mom", "lr_range_test_min_lr"})
"""Schedule parameters DeepSpeed also takes as a list with one number per parameter group."""


def _per_group_numbers(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)


def _check(block: str, owner: str, params: dict[str, Any], accepted: dict[str, Any],
           per_group: frozenset[str] = frozenset()) -> list[Problem]:
    problems = []
    for name, value in params.items():
        if value == "auto" or (name in per_group and _per_group_numbers(value)):
            continue  # "auto": resolved (or dropped) by the engine; a per-group list: the engine checks its length
        if name not in accepted:
            problems.append(Problem(f"{block}.params.{name}", f"is not a parameter of {owner}",
                                    suggestion=did_you_mean(name, sorted(accepted))))
            continue
        kinds = _kind(accepted[name])
        wrong = kinds is not None and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)))
        if wrong:
            expected = " or ".join(k.__name__ for k in kinds)  # type: ignore[union-attr]
            problems.append(Problem(f"{block}.params.{name}",
                                    f"{owner} takes {expected} here, got {type(value).__name__} {value!r}"))
    return problems


def optimizer_problems(cfg: ZerorunConfig) -> list[Problem]:
    """What ``build_optimizer`` would reject in ``cfg.optimizer`` (torch's own signature)."""
    if cfg.optimizer is None:
        return []
    return _optimizer_problems(cfg.optimizer.type, dict(cfg.optimizer.params))


def _optimizer_problems(name: str, params: dict[str, Any]) -> list[Problem]:
    key = name.lower()
    if key not in OPTIMIZERS:
        return [Problem("optimizer.type", f"{name!r} is not a torch.optim class")]
    if key == "adam" and params.get("adam_w_mode", True):
        key = "adamw"  # DeepSpeed's Adam is AdamW unless adam_w_mode: false
    cls_name, defaults = OPTIMIZERS[key]
    accepted = {**defaults, **dict.fromkeys(DROPPED, True)}
    return _check("optimizer", f"torch.optim.{cls_name}", params, accepted)


def scheduler_problems(cfg: ZerorunConfig) -> list[Problem]:
    """What ``build_scheduler`` would reject in ``cfg.scheduler`` (the schedule's fields)."""
    if cfg.scheduler is None:
        return []

    return _scheduler_problems(cfg.scheduler.type, dict(cfg.scheduler.params))


def _scheduler_problems(name: str, params: dict[str, Any]) -> list[Problem]:
    accepted = SCHEDULES.get(name)
    if accepted is None:
        return [Problem("scheduler.type", f"{name!r} is accepted in configs but the bundled engine has no such "
                        f"schedule; use one of {', '.join(SCHEDULES)} or pass lr_scheduler= to initialize()")]
    return _check("scheduler", name, params, accepted, PER_GROUP)


def builder_problems(cfg: ZerorunConfig) -> list[Problem]:
    """Every problem ``initialize`` would hit building the config's optimizer and scheduler."""
    return optimizer_problems(cfg) + scheduler_problems(cfg)


def raw_builder_problems(raw: dict[str, Any]) -> list[Problem]:
    """The same checks on the raw file, for a config the schema already rejected: every problem is
    reported in one pass, not the params' only after the schema's are fixed."""
    problems = []
    for block, check in (("optimizer", _optimizer_problems), ("scheduler", _scheduler_problems)):
        value = raw.get(block)
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            params = value.get("params") or {}
            if isinstance(params, dict):
                problems += check(value["type"], params)
    return problems
