"""Loading a config: read, rewrite old names, resolve "auto", validate, derive, check.

``load_config`` is what the engine calls; ``inspect_config`` returns the same config
with its provenance, warnings and notes, for ``validate`` and ``print-config``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerorun.config import keys
from zerorun.config.aliases import rewrite
from zerorun.config.auto import resolve_auto
from zerorun.config.batch import BatchError, implied_world_size, resolve_batch
from zerorun.config.compat import strip_compat
from zerorun.config.elastic import ElasticError
from zerorun.config.elastic import keep_global_batch as keep_global_batch_at
from zerorun.config.elastic_apply import apply_elasticity
from zerorun.config.problems import ConfigError, ConfigWarning, Problem, Severity
from zerorun.config.provenance import Origin, trace
from zerorun.config.read import read_source
from zerorun.config.rules import check_rules
from zerorun.config.schema import BATCH_KEYS, ZerorunConfig
from zerorun.config.validation import validate_schema

Source = str | Path | dict[str, Any] | None


@dataclass(frozen=True)
class LoadedConfig:
    """A resolved config and everything known about how it was resolved."""

    config: ZerorunConfig
    origin: str
    provenance: dict[str, Origin]
    warnings: tuple[Problem, ...]
    notes: tuple[Problem, ...]
    world_size: int | None
    hidden_size: int | None


def _check_size(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(
            f"--{name.replace('_', '-')}",
            [Problem("", f"{name} must be a positive integer, got {value!r}")],
            hint=f"pass {name} as an int >= 1",
        )


def _derive_batch(
    cfg: ZerorunConfig, world_size: int | None, batch_auto: list[str], keep_global_batch: bool = False
) -> tuple[ZerorunConfig, list[Problem], dict[str, str]]:
    """Fill in the batch triple (with a world size) or check what can be checked without one.

    ``keep_global_batch`` (an elastic restart): the accumulation is re-derived for this world.
    """
    given = (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps)
    if keep_global_batch and world_size is not None and given[0] is not None and given[1] is not None:
        try:
            keep_global_batch_at(given[0], given[1], world_size)
        except ElasticError as err:
            return cfg, [Problem(err.key, f"{err.message}; {err.hint}")], {}
        given = (given[0], given[1], None)
    derived: dict[str, str] = {}
    notes: list[Problem] = []
    try:
        if world_size is None:
            implied = implied_world_size(*given)
            if batch_auto:
                notes.append(
                    Problem(
                        ", ".join(batch_auto),
                        '"auto" is derived at run time from the other batch keys and the world size',
                        severity=Severity.NOTE,
                    )
                )
            if implied is not None:
                notes.append(
                    Problem(
                        "train_batch_size",
                        f"the batch keys imply a world size of {implied}",
                        severity=Severity.NOTE,
                    )
                )
            return cfg, notes, {key: "derived at run time" for key in batch_auto}
        plan = resolve_batch(*given, world_size)
    except BatchError as err:
        return cfg, [Problem(err.path, f"{err.message}; {err.hint}")], derived
    if plan.derived and BATCH_KEYS[1] in plan.derived and given[0] is None:
        notes.append(
            Problem(
                BATCH_KEYS[1],
                "neither train_batch_size nor train_micro_batch_size_per_gpu is set; the micro batch is 1",
                severity=Severity.NOTE,
            )
        )
    for key in plan.derived:
        derived[key] = f"from the other batch keys and world_size={world_size}"
    update = {key: getattr(plan, key) for key in BATCH_KEYS}
    return cfg.model_copy(update=update), notes, derived


def _derive_overlap(cfg: ZerorunConfig) -> tuple[ZerorunConfig, dict[str, str]]:
    zero = cfg.zero_optimization
    if zero.overlap_comm is not None:
        return cfg, {}
    overlap = zero.stage == 3
    zero = zero.model_copy(update={"overlap_comm": overlap})
    return cfg.model_copy(update={"zero_optimization": zero}), {
        "zero_optimization.overlap_comm": f"stage {zero.stage}"
    }


def strip_dotted(data: dict[str, Any]) -> list[Problem]:
    """Remove top-level keys written with dots (``"zero_optimization.reduce_bucket_size"``); report each.

    TRL's ``prepare_deepspeed`` writes three such keys for its reference model. DeepSpeed
    reads its config block by block and never looks at them, so they change nothing there;
    zerorun ignores them too, so one script configures the same run on both (see docs/config.md).
    """
    problems = []
    for key in [k for k in data if isinstance(k, str) and "." in k]:
        value = data.pop(key)
        where = (f"set `{key.rsplit('.', 1)[-1]}: {value!r}` inside the `{key.rsplit('.', 1)[0]}` block for it "
                 "to take effect" if key in keys.fields() else "it names no config key")
        problems.append(Problem(key, f"a dotted top-level key is ignored, as DeepSpeed ignores it ({where})",
                                severity=Severity.WARNING))
    return problems


def inspect_config(
    source: Source, *, world_size: int | None = None, hidden_size: int | None = None,
    keep_global_batch: bool = False,
) -> LoadedConfig:
    """Load ``source`` and report how every value was resolved; ``ConfigError`` lists all errors.

    ``keep_global_batch``: an elastic restart at another world keeps ``train_batch_size`` and the
    micro batch and re-derives the accumulation (or is refused naming the worlds that would work).
    """
    _check_size("world_size", world_size)
    _check_size("hidden_size", hidden_size)
    raw, origin = read_source(source)
    problems = apply_elasticity(raw, world_size) + strip_compat(raw) + strip_dotted(raw)
    renamed = rewrite(raw)
    problems += renamed.problems
    given = frozenset(keys.leaves(raw)) - set(renamed.renamed)
    auto = resolve_auto(raw, hidden_size=hidden_size)
    problems += auto.notes
    cfg, schema_problems, invalid = validate_schema(auto.data)
    problems += schema_problems
    derived: dict[str, str] = {}
    if not invalid & set(BATCH_KEYS):
        cfg, batch_problems, derived = _derive_batch(cfg, world_size, auto.batch_auto, keep_global_batch)
        problems += batch_problems
    cfg, overlap = _derive_overlap(cfg)
    derived.update(overlap)
    problems += check_rules(cfg, given, invalid)
    by = {severity: [p for p in problems if p.severity is severity] for severity in Severity}
    if by[Severity.ERROR]:
        raise ConfigError(origin, by[Severity.ERROR], warnings=by[Severity.WARNING])
    auto_paths = {**auto.resolved, **{key: derived.pop(key) for key in auto.batch_auto if key in derived}}
    provenance = trace(keys.leaves(cfg.model_dump()), given, renamed.renamed, auto_paths, derived)
    return LoadedConfig(
        cfg,
        origin,
        provenance,
        tuple(by[Severity.WARNING]),
        tuple(by[Severity.NOTE]),
        world_size,
        hidden_size,
    )


def load_config(
    source: Source, *, world_size: int | None = None, hidden_size: int | None = None,
    keep_global_batch: bool = False,
) -> ZerorunConfig:
    """The validated config from a path (JSON/YAML), a dict, or None (all defaults).

    With ``world_size`` the batch triple is complete; with ``hidden_size`` the
    hidden-size "auto" values take their formulas (else DeepSpeed's defaults).
    Warnings (deprecated names, keys with no effect) are issued as ``ConfigWarning``;
    every error is listed in one ``ConfigError``.
    """
    loaded = inspect_config(source, world_size=world_size, hidden_size=hidden_size,
                            keep_global_batch=keep_global_batch)
    for problem in loaded.warnings:
        warnings.warn(ConfigWarning(problem.render(loaded.origin)), stacklevel=2)
    return loaded.config
