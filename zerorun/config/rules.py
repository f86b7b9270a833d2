"""Cross-field rules that DeepSpeed misses or only asserts late. Pure functions.

Each rule reads a validated config and returns problems. ``RULES`` pairs each rule
with the keys it reads, so that a rule is skipped when one of those keys was itself
invalid (its value then is only a stand-in default, and the rule would report noise).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from zerorun.config.noop import keys_without_effect
from zerorun.config.problems import ConfigError, ConfigWarning, Problem, Severity
from zerorun.config.schema import ZerorunConfig
from zerorun.config.schema_blocks import OPTIMIZERS
from zerorun.config.schema_zero import STAGE3_ONLY_KEYS, ZeroConfig
from zerorun.errors import UnsupportedFeature, ZerorunError

Rule = Callable[[ZerorunConfig, frozenset[str]], list[Problem]]

ZERO = "zero_optimization"


def precision_exclusive(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    if cfg.fp16.enabled and cfg.bf16.enabled:
        return [
            Problem(
                "fp16.enabled",
                "fp16 and bf16 are both enabled; enable at most one of fp16.enabled and bf16.enabled",
            )
        ]
    return []


def amp_unsupported(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    if cfg.amp.enabled:
        return [
            Problem(
                "amp.enabled",
                "apex AMP is not supported by zerorun; set amp.enabled: false and fp16.enabled: true (or bf16.enabled: true)",
            )
        ]
    return []


def nvme_needs_path(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    problems = []
    for name in ("offload_optimizer", "offload_param"):
        block = getattr(cfg.zero_optimization, name)
        if block.device == "nvme" and not block.nvme_path:
            problems.append(
                Problem(
                    f"{ZERO}.{name}.nvme_path",
                    f"{ZERO}.{name}.device is nvme but nvme_path is not set; set it to a directory on a local NVMe drive",
                )
            )
    return problems


def offload_param_needs_stage3(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    zero = cfg.zero_optimization
    if zero.offload_param.device != "none" and zero.stage != 3:
        return [
            Problem(  # DeepSpeed ignores the block below stage 3 (its ZeRO-3 engine alone reads it): so does zerorun
                f"{ZERO}.offload_param.device",
                f"parameter offload ({zero.offload_param.device}) needs {ZERO}.stage 3, but stage is {zero.stage}: "
                "ignored, as DeepSpeed does; set stage: 3, or offload_param.device: none "
                "(offload_optimizer works from stage 1)",
                severity=Severity.WARNING,
            )
        ]
    return []


def offload_optimizer_needs_zero(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    zero = cfg.zero_optimization
    problems = []
    if zero.offload_optimizer.device != "none" and zero.stage == 0:
        problems.append(
            Problem(
                f"{ZERO}.offload_optimizer.device",
                f"optimizer offload ({zero.offload_optimizer.device}) needs {ZERO}.stage 1, 2 or 3, but stage is 0",
            )
        )
    if zero.offload_optimizer.ratio < 1.0 and zero.stage != 3:
        problems.append(
            Problem(
                f"{ZERO}.offload_optimizer.ratio",
                f"partial offload (ratio {zero.offload_optimizer.ratio:g}) needs {ZERO}.stage 3, but stage is {zero.stage}",
            )
        )
    return problems


def low_precision_masters(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """bf16 masters, gradients and moments as DeepSpeed 0.19.8 allows them (``runtime/config.py``: ZeRO
    stage 1-3, optimizer states only with the masters); fp16 masters stay refused."""
    bf16, stage = cfg.bf16, cfg.zero_optimization.stage
    problems = []
    if cfg.fp16.fp16_master_weights_and_grads:
        problems.append(Problem("fp16.fp16_master_weights_and_grads",
                                "is not supported: fp16 masters lose updates under loss scaling; "
                                "use bf16 with bf16.bf16_master_weights_and_grads, or remove it"))
    if bf16.bf16_master_weights_and_grads:
        if not bf16.enabled:
            problems.append(Problem("bf16.bf16_master_weights_and_grads", "needs bf16.enabled: true"))
        if stage == 0:
            problems.append(Problem("bf16.bf16_master_weights_and_grads",
                                    f"needs {ZERO}.stage 1, 2 or 3 (as in DeepSpeed), but stage is 0"))
        if not bf16.bf16_optimizer_states:
            problems.append(Problem("bf16.bf16_master_weights_and_grads",
                                    "without bf16.bf16_optimizer_states is not supported: zerorun keeps the "
                                    "optimizer state in the masters' dtype; set bf16_optimizer_states: true"))
    elif bf16.bf16_optimizer_states:
        problems.append(Problem("bf16.bf16_optimizer_states",
                                "needs bf16.bf16_master_weights_and_grads: true (as in DeepSpeed)"))
    if bf16.master_compensation != "none" and not bf16.bf16_master_weights_and_grads:
        problems.append(Problem("bf16.master_compensation", "has no effect without bf16.bf16_master_weights_and_grads "
                                                            "(fp32 masters lose no updates); remove it",
                                severity=Severity.WARNING))
    return problems


def torch_autocast_rules(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """Autocast alone keeps fp32 parameters; with bf16.enabled the parameters are bf16 and the forward still
    runs under autocast (DeepSpeed 0.19.8 combines them the same way)."""
    auto = cfg.torch_autocast
    if not auto.enabled:
        return []
    problems = []
    if cfg.fp16.enabled:
        problems.append(Problem("torch_autocast.enabled", "cannot be combined with fp16.enabled (fp16 autocast "
                                                          "needs a gradient scaler); use bf16.enabled, or neither"))
    if auto.dtype == "fp16":
        problems.append(Problem("torch_autocast.dtype", "fp16 is not supported: zerorun runs autocast in "
                                                        "bfloat16 only (fp16 autocast needs a gradient scaler); "
                                                        "set it to bf16"))
    return problems


def sum_below_stage3(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """DeepSpeed refuses ``gradient_allreduce_op: sum`` at stage 3; so does zerorun (its message, which scripts match)."""
    if cfg.gradient_allreduce_op == "sum" and cfg.zero_optimization.stage == 3:
        return [Problem("gradient_allreduce_op", "'sum' is not supported with ZeRO stage 3 (DeepSpeed refuses it too): "
                                                 "use mean, the default, or stage 0-2")]
    return []


def stage3_keys_below_stage3(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    zero = cfg.zero_optimization
    if zero.stage == 3:
        return []
    defaults = ZeroConfig.model_fields
    return [
        Problem(
            f"{ZERO}.{key}", f"has no effect at stage {zero.stage} (stage 3 only)", severity=Severity.WARNING
        )
        for key in STAGE3_ONLY_KEYS
        if f"{ZERO}.{key}" in given and getattr(zero, key) != defaults[key].default
    ]


def zeropp_groups(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """hpZ and MiCS are two layouts of one stage 3: not both; a hierarchical gather needs MiCS's groups.
    (Sizes against the world and the nodes: the launcher's check, :mod:`zerorun.engine.comm.group_plan`.)"""
    zero = cfg.zero_optimization
    if zero.zero_hpz_partition_size > 1 and zero.mics_shard_size > 0:
        return [Problem(f"{ZERO}.zero_hpz_partition_size", "is set together with mics_shard_size; pick one: hpZ "
                        "keeps a secondary copy per node, MiCS shards inside groups (DeepSpeed runs MiCS alone)")]
    if zero.mics_hierarchical_params_gather and zero.mics_shard_size <= 0:
        return [Problem(f"{ZERO}.mics_hierarchical_params_gather", "is set without mics_shard_size; set "
                        "mics_shard_size too, or drop it")]
    return []


def unused_parameters_assert(cfg: ZerorunConfig) -> bool:
    """Whether ``ignore_unused_parameters: false`` makes the step assert that every parameter got a gradient:
    DeepSpeed reads the key only in its CPU-offload path at stages 1-2, and so does zerorun."""
    zero = cfg.zero_optimization
    return not zero.ignore_unused_parameters and zero.stage in (1, 2) and zero.offload_optimizer.device == "cpu"


def unused_parameters_elsewhere(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """``ignore_unused_parameters: false`` where DeepSpeed does not read it: a warning that it changes nothing."""
    if cfg.zero_optimization.ignore_unused_parameters or unused_parameters_assert(cfg):
        return []
    return [Problem(f"{ZERO}.ignore_unused_parameters", "is accepted for DeepSpeed compatibility but has no effect "
                    "in zerorun's engine here (as in DeepSpeed, it is read only with offload_optimizer.device: cpu "
                    "at stages 1-2, where false makes the step assert that every parameter got a gradient); "
                    "remove it", severity=Severity.WARNING)]


RULES: tuple[tuple[tuple[str, ...], Rule], ...] = (
    (("fp16.enabled", "bf16.enabled"), precision_exclusive),
    (("amp.enabled",), amp_unsupported),
    ((f"{ZERO}.offload_optimizer", f"{ZERO}.offload_param"), nvme_needs_path),
    ((f"{ZERO}.stage", f"{ZERO}.offload_param"), offload_param_needs_stage3),
    ((f"{ZERO}.stage", f"{ZERO}.offload_optimizer"), offload_optimizer_needs_zero),
    (("fp16", "bf16", f"{ZERO}.stage"), low_precision_masters),
    (("torch_autocast", "fp16.enabled", "bf16.enabled"), torch_autocast_rules),
    ((f"{ZERO}.stage",), stage3_keys_below_stage3),
    ((f"{ZERO}.zero_hpz_partition_size", f"{ZERO}.mics_shard_size"), zeropp_groups),
    (("gradient_allreduce_op", f"{ZERO}.stage"), sum_below_stage3),
    ((f"{ZERO}.ignore_unused_parameters",), unused_parameters_elsewhere),
    ((), keys_without_effect),
)


def check_rules(cfg: ZerorunConfig, given: frozenset[str], invalid: frozenset[str]) -> list[Problem]:
    """Every cross-field problem of ``cfg``, skipping rules that read an ``invalid`` key."""
    problems: list[Problem] = []
    for reads, rule in RULES:
        tainted = any(
            bad == read or bad.startswith(f"{read}.") or read.startswith(f"{bad}.")
            for bad in invalid
            for read in reads
        )
        if not tainted:
            problems.extend(rule(cfg, given))
    return problems


TESTED_CLIENT_OPTIMIZERS = (*OPTIMIZERS, "FusedAdam", "DeepSpeedCPUAdam")
"""Client optimizer classes ZeRO runs without ``zero_allow_untested_optimizer`` (the last two:
``deepspeed.ops.adam`` under ``--as_deepspeed``, torch's Adam underneath)."""


def check_client_optimizer(
    cfg: ZerorunConfig, has_client_optimizer: bool, client_optimizer_name: str | None = None
) -> None:
    """Check a client optimizer against the config (the engine calls this in ``initialize``).

    A client optimizer and a config ``optimizer`` block together: the client's is used,
    as DeepSpeed does, with a ``ConfigWarning`` saying the block is ignored (DeepSpeed is
    silent). An optimizer class zerorun has not been tested with needs
    ``zero_allow_untested_optimizer: true`` under ZeRO (stage >= 1): ``ConfigError``.
    """
    if has_client_optimizer and cfg.optimizer is not None:
        warnings.warn(ConfigWarning(
            f"initialize: optimizer: the config's optimizer block ({cfg.optimizer.type}) is ignored: "
            f"initialize() was given an optimizer ({client_optimizer_name or 'a client optimizer'}), which is "
            "used, as DeepSpeed does (remove one of the two to silence this)"), stacklevel=3)
    untested = client_optimizer_name is not None and client_optimizer_name not in TESTED_CLIENT_OPTIMIZERS
    if (
        has_client_optimizer
        and untested
        and cfg.zero_optimization.stage > 0
        and not cfg.zero_allow_untested_optimizer
    ):
        problem = Problem(
            "zero_allow_untested_optimizer",
            f"the client optimizer {client_optimizer_name} is untested with ZeRO stage {cfg.zero_optimization.stage}",
        )
        raise ConfigError(
            "initialize", [problem], hint="set zero_allow_untested_optimizer: true to use it anyway"
        )


_DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}


def check_grad_accum_dtype(cfg: ZerorunConfig) -> None:
    """DeepSpeed's rule for ``data_types.grad_accum_dtype`` (the engine calls this in ``initialize``).

    At stage 0 it must be the training dtype: DeepSpeed raises ``NotImplementedError`` for any other
    mix (its stage-0 optimizer wrappers accumulate in the parameters' dtype), so does zerorun.
    Stages 1-3 take any value (DeepSpeed's ZeRO optimizers do; zerorun keeps its own accumulation dtype).
    """
    wanted = cfg.data_types.grad_accum_dtype
    model = "fp16" if cfg.fp16.enabled else "bf16" if cfg.bf16.enabled else "fp32"
    if wanted is None or wanted == model or cfg.zero_optimization.stage > 0:
        return
    raise UnsupportedFeature(
        f"unsupported mix of model_dtype={_DTYPES[model]} and grad_accum_dtype={_DTYPES[wanted]} "
        "(data_types.grad_accum_dtype at ZeRO stage 0)",
        f"set data_types.grad_accum_dtype to {model} (or remove it), or use ZeRO stage 1-3")


class DeepSpeedAssert(ZerorunError, AssertionError):
    """A config DeepSpeed refuses with an ``assert`` in its engine: an ``AssertionError`` too, in its words."""


ALIGNMENT = 2
"""DeepSpeed's ``nccl_start_alignment_factor`` (4-byte alignment / sizeof(fp16)) in its stage 1-2 optimizer."""


def check_deepspeed_asserts(cfg: ZerorunConfig) -> None:
    """What DeepSpeed's ZeRO stage 1-2 optimizer asserts on its config (the engine calls this in ``initialize``).

    ``allgather_bucket_size`` has no effect in zerorun (stages 1-2 all-gather the reduce buckets), but a
    value DeepSpeed refuses is refused here too, so a config that runs here runs there.
    """
    zero = cfg.zero_optimization
    if zero.stage in (1, 2) and zero.allgather_bucket_size % ALIGNMENT != 0:
        raise DeepSpeedAssert(
            f"allgather_bucket_size must be a multiple of nccl_start_alignment_factor, {ALIGNMENT} "
            f"(zero_optimization.allgather_bucket_size is {zero.allgather_bucket_size})",
            "set zero_optimization.allgather_bucket_size to an even number, as DeepSpeed requires")
