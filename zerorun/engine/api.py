"""``zerorun.initialize`` and ``zerorun.add_config_arguments``: DeepSpeed's entry points.

A DeepSpeed script ports by changing its import::

    engine, optimizer, dataloader, lr_scheduler = zerorun.initialize(
        model=model, model_parameters=model.parameters(), config="ds_config.json")

Without ``config`` the engine uses the file the launcher passed: ``args.deepspeed_config``
/ ``args.config`` when ``args`` is given, else the ``ZERORUN_CONFIG`` environment
variable (set by ``zerorun --config FILE``), else a ``--config`` / ``--deepspeed_config``
flag in ``sys.argv``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerorun.engine.build import build_parts
from zerorun.engine.comm import comms_logger
from zerorun.engine.comm.bootstrap import DistContext, init_distributed
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.comm.groups import build_groups
from zerorun.engine.engine import Engine
from zerorun.engine.errors import DeepSpeedAssertion, EngineError, MissingModel, rank_prefixed
from zerorun.engine.inference import InferenceEngine, build_inference_parts
from zerorun.engine.mechanism.accumulator import ShardAccumulator
from zerorun.engine.mechanism.grad_sync import ReducePolicy
from zerorun.engine.numerics import precision as precision_mod
from zerorun.engine.offload import from_config as offload_from_config
from zerorun.engine.offload.params import param_policy
from zerorun.engine.policy import policy_for_stage
from zerorun.engine.surface import ds_param_attrs, flat_groups, partition_views, zero_optimizer
from zerorun.engine.surface.host_grad_sums import HostGradSums
from zerorun.engine.surface.parameter_offload import ParameterOffload, install_module_surface
from zerorun.engine.training.dataloader import build_dataloader
from zerorun.engine.training.host_kernel import warn_client
from zerorun.engine.training.optim_factory import build_optimizer
from zerorun.engine.training.schedulers import build_scheduler
from zerorun.engine.trial import trial_config

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from zerorun.config.load import Source
    from zerorun.config.schema import ZerorunConfig
    from zerorun.engine.numerics.precision import PrecisionPolicy
    from zerorun.engine.policy import StagePolicy
    from zerorun.engine.training.dataloader import TrainingDataLoader
    from zerorun.engine.training.schedulers import LRSchedulerLike

    # DeepSpeed's model_parameters: tensors, or parameter-group dicts
    Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]
    OptimizerArg = torch.optim.Optimizer | Callable[[Params], torch.optim.Optimizer]
    SchedulerArg = LRSchedulerLike | Callable[[torch.optim.Optimizer], LRSchedulerLike]

CONFIG_ENV = "ZERORUN_CONFIG"
_FLAGS = ("--config", "--deepspeed_config", "--deepspeed-config")


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--deepspeed``, ``--deepspeed_config`` (alias ``--config``) and ``--local_rank``, as DeepSpeed's helper does.

    Flags the parser already has are left to it: most DeepSpeed scripts declare their own
    ``--local_rank`` (and some a ``--config`` of their own), which would otherwise clash. A
    ``--local_rank`` the script declares afterwards replaces ours.
    """
    have = parser._option_string_actions  # argparse's own registry of the option strings taken

    def free(*flags: str) -> list[str]:
        return [f for f in flags if f not in have]

    group = parser.add_argument_group("zerorun", "zerorun / DeepSpeed configuration")
    if flags := free("--deepspeed"):
        group.add_argument(*flags, default=False, action="store_true",
                           help="enable the engine (accepted for DeepSpeed compatibility; always on)")
    if flags := free("--deepspeed_config", "--config"):
        group.add_argument(*flags, dest="deepspeed_config", default=None, type=str,
                           help="engine config file (JSON or YAML, DeepSpeed keys)")
    if flags := free("--deepscale"):  # DeepSpeed's deprecated names
        group.add_argument(*flags, default=False, action="store_true", help=argparse.SUPPRESS)
    if flags := free("--deepscale_config"):
        group.add_argument(*flags, default=None, type=str, help=argparse.SUPPRESS)
    if (flags := free("--local_rank", "--local-rank")) and len(flags) == 2:
        # DeepSpeed's helper adds no --local_rank, so scripts also declare theirs *after* calling
        # it: a later declaration replaces ours instead of raising argparse's conflict error, and
        # the default lives in the parser's defaults, so a later declaration's own default wins
        parser.set_defaults(local_rank=int(os.environ.get("LOCAL_RANK", 0)))
        group.add_argument(*flags, type=int, default=argparse.SUPPRESS,
                           help="set by launchers that pass it as a flag")
        for container in (parser, *parser._action_groups):  # each group keeps its own copy
            container.conflict_handler = "resolve"
    return parser


def _config_from_argv(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        for flag in _FLAGS:
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def resolve_config_source(config: Source, args: object | None = None) -> str | Path | dict[str, Any]:
    """The config to load: explicit, else ``args``, else ``$ZERORUN_CONFIG``, else ``--config`` in sys.argv.

    An explicit config and a different one in ``args`` are two configs for one run: an error
    naming both (DeepSpeed refuses the pair too), never one silently winning."""
    if config is not None:
        _one_config(config, args)
        return config
    for attr in ("deepspeed_config", "config", "deepscale_config"):
        value = getattr(args, attr, None) if args is not None else None
        if isinstance(value, (str, Path, dict)):
            return value
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV]
    found = _config_from_argv(sys.argv[1:])
    if found is not None:
        return found
    raise EngineError("no engine config was given",
                      "pass config=PATH_OR_DICT to zerorun.initialize, run with --config FILE, "
                      f"or launch with `zerorun --config FILE` (which sets {CONFIG_ENV})")


def _one_config(config: Source, args: object | None) -> None:
    for attr in ("deepspeed_config", "deepscale_config"):
        other = getattr(args, attr, None) if args is not None else None
        if isinstance(other, (str, Path, dict)) and other != config and not _same_file(other, config):
            given = "a dict" if isinstance(config, dict) else repr(str(config))
            raise EngineError(f"two configs for one run: initialize(config={given}) and --{attr} {str(other)!r}",
                              f"keep one: drop config= from zerorun.initialize, or the --{attr} argument")


def _same_file(a: object, b: object) -> bool:
    return isinstance(a, (str, Path)) and isinstance(b, (str, Path)) and Path(a).resolve() == Path(b).resolve()


def _hidden_size(model: nn.Module) -> int | None:
    value = getattr(getattr(model, "config", None), "hidden_size", None)
    return value if isinstance(value, int) else None


def _make_optimizer(cfg: ZerorunConfig, optimizer: OptimizerArg | None, model: nn.Module,
                    model_parameters: Params | None) -> torch.optim.Optimizer:
    from zerorun.config import check_client_optimizer, check_deepspeed_asserts, check_grad_accum_dtype

    client = optimizer is not None
    if client and not isinstance(optimizer, torch.optim.Optimizer) and callable(optimizer):
        params = model_parameters if model_parameters is not None else model.parameters()
        optimizer = optimizer(params)
    check_client_optimizer(cfg, client, type(optimizer).__name__ if client else None)
    check_grad_accum_dtype(cfg)
    check_deepspeed_asserts(cfg)
    host_step = offload_from_config(cfg.zero_optimization).enabled  # the masters live (and step) on the host
    if client:
        warn_client(optimizer, host_step)
        return optimizer
    if cfg.optimizer is None:
        raise EngineError("no optimizer: the config has no `optimizer` block and initialize() got none",
                          'add e.g. optimizer: {type: AdamW, params: {lr: 1e-4}} to the config, '
                          "or pass optimizer= to initialize()")
    params: Iterable[Any] = model_parameters if model_parameters is not None else model.parameters()
    return build_optimizer(cfg.optimizer.type, dict(cfg.optimizer.params), params, host_step)


def _make_scheduler(cfg: ZerorunConfig, lr_scheduler: SchedulerArg | None,
                    optimizer: torch.optim.Optimizer) -> LRSchedulerLike | None:
    if lr_scheduler is not None:
        is_object = hasattr(lr_scheduler, "step")
        return lr_scheduler if is_object else lr_scheduler(optimizer)
    if cfg.scheduler is None:
        return None
    return build_scheduler(cfg.scheduler.type, dict(cfg.scheduler.params), optimizer)


def initialize(model: nn.Module | None = None, optimizer: OptimizerArg | None = None,
               model_parameters: Params | None = None, config: str | Path | dict[str, Any] | None = None,
               lr_scheduler: SchedulerArg | None = None, training_data: Dataset[Any] | None = None,
               collate_fn: Callable[..., Any] | None = None, dist_init_required: bool | None = None, *,
               args: object | None = None, config_params: str | Path | dict[str, Any] | None = None,
               mpu: object | None = None) -> tuple[Engine, torch.optim.Optimizer | None,
                                                   TrainingDataLoader | None, LRSchedulerLike | None]:
    """Build the ZeRO engine. Returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    ``model``: the ``nn.Module`` to train (moved to this rank's device). ``optimizer``: a
    torch optimizer (or a callable taking parameters) - else the config's ``optimizer``
    block is built over ``model_parameters`` (default: all of the model's). ``config``:
    a path (JSON/YAML) or a dict with DeepSpeed's keys. ``lr_scheduler``: an object with
    ``step()`` or a callable taking the optimizer - else the config's ``scheduler``.
    ``training_data``: a dataset; a DistributedSampler-backed DataLoader of the micro
    batch size is returned for it. A default process group that already exists is reused.
    ``args`` is any object (DeepSpeed's too): only its ``deepspeed_config``/``config`` attributes are
    read; ``mpu`` is refused unless None.
    """
    if isinstance(model, argparse.Namespace):  # DeepSpeed's positional order is (args, model, ...)
        args, model, optimizer, model_parameters = model, optimizer, model_parameters, None
    if model is None:
        raise MissingModel("initialize() needs model=", "pass the nn.Module to train: initialize(model=model, ...)")
    if mpu is not None:
        raise EngineError("model parallelism (mpu=) is not supported", "drop mpu=; the engine is data-parallel")

    if dist_init_required is False and not torch.distributed.is_initialized():
        raise DeepSpeedAssertion("Distributed backend is not initialized. Please set dist_init_required to True or "
                                 "initialize before calling deepspeed.initialize()",
                                 "drop dist_init_required=False (zerorun joins the launcher's process group), "
                                 "or call torch.distributed.init_process_group() first")
    ctx = init_distributed()
    try:
        return _initialize(ctx, model, optimizer, model_parameters, config if config is not None else config_params,
                           lr_scheduler, training_data, collate_fn, args)
    except EngineError as e:  # errors inside ranks start with [rank N]
        raise EngineError(rank_prefixed(ctx.rank, e.message), e.hint) from e


ELASTIC_ENV = "ZERORUN_ELASTIC"
"""Set to 1 by an elastic launch (``--nnodes MIN:MAX``) or by hand: keep train_batch_size across world sizes."""


def _initialize(ctx: DistContext, model: nn.Module, optimizer: OptimizerArg | None,
                model_parameters: Params | None, config: Source, lr_scheduler: SchedulerArg | None,
                training_data: Dataset[Any] | None, collate_fn: Callable[..., Any] | None,
                args: object | None) -> tuple[Engine, torch.optim.Optimizer | None, TrainingDataLoader | None,
                                              LRSchedulerLike | None]:
    from zerorun.config import load_config
    from zerorun.config.rules import unused_parameters_assert

    source = resolve_config_source(config, args)
    source = trial_config(source)  # `zerorun autotune`: the trial's knobs over the user's config
    # ZERORUN_ELASTIC (set by an elastic launch): a restart at another world keeps the global batch
    cfg = load_config(source, world_size=ctx.world_size, hidden_size=_hidden_size(model),
                      keep_global_batch=os.environ.get(ELASTIC_ENV) == "1")
    if cfg.comms_logger.enabled:  # the process's logger (DeepSpeed's dist.configure): a later engine
        comms_logger.LOGGER.configure(cfg.comms_logger)  # without the block leaves it as it is
    stage = policy_for_stage(cfg.zero_optimization.stage)
    precision = precision_mod.from_config(cfg)
    # the bootstrap's group at world 1 too: its backend decides the policy (NCCL's buckets on one GPU)
    coll = Collectives(ctx.group, ctx.world_size, ctx.rank)
    if optimizer is None and cfg.optimizer is None:  # a reference/teacher/eval model: forward passes only
        if not stage.shard_parameters:  # sharded parameters move unit by unit (units.plan_units)
            model.to(ctx.device)
        return _initialize_inference(ctx, coll, model, cfg, stage, precision, lr_scheduler, training_data,
                                     collate_fn)
    opt = _make_optimizer(cfg, optimizer, model, model_parameters)
    zero = cfg.zero_optimization
    reduce = ReducePolicy(comm_dtype=precision.comm_dtype,
                          predivide=float(cfg.gradient_predivide_factor) if cfg.prescale_gradients else 1.0,
                          overlap_comm=bool(zero.overlap_comm), accum_dtype=precision.master_dtype,
                          quantized=bool(zero.zero_quantized_gradients) and stage.shard_parameters,
                          average=cfg.gradient_allreduce_op == "mean",
                          require_all_used=unused_parameters_assert(cfg))
    offload = offload_from_config(zero)
    param_offload = param_policy(zero)  # offload_param: stage 3 only
    groups = (build_groups(coll, zero.zero_hpz_partition_size, zero.mics_shard_size,
                           zero.mics_hierarchical_params_gather) if stage.shard_parameters else None)
    parts = build_parts(model, opt, ctx, coll, stage, precision, zero, reduce, offload, param_offload, groups)
    scheduler = _make_scheduler(cfg, lr_scheduler, opt)
    engine = Engine(model, opt, scheduler, cfg, ctx, coll, stage, precision, parts)
    _deepspeed_attributes(engine)
    _compile_if_configured(engine, cfg)
    return engine, opt, _attach_loader(engine, training_data, collate_fn), scheduler


def _compile_if_configured(engine: Engine, cfg: ZerorunConfig) -> None:
    """The config's ``compile.enabled``: ``engine.compile(backend, kwargs)`` now (DeepSpeed 0.13.2-0.14.3 compiled
    at initialize from these keys); a later ``engine.compile()`` (accelerate's) then does nothing."""
    if cfg.compile.enabled:
        engine.compile(backend=cfg.compile.backend, compile_kwargs=dict(cfg.compile.kwargs))


def _deepspeed_attributes(engine: Engine) -> None:
    """What libraries written for DeepSpeed read from its optimizer and parameters (after the build:
    a bucket's persistence is set by then, which is no state transition)."""
    model, opt, parts, stage = engine.module, engine.optimizer, engine.parts, engine.stage
    zero_optimizer.expose(opt, stage.shard_optimizer, engine.precision.scaler.dynamic)
    if stage.shard_optimizer:
        partition_views.expose_gradients(opt, engine)
        partition_views.expose_partitions(opt, engine, parts.coordinator is not None)
    if not hasattr(opt, "overflow"):
        opt.overflow = False  # type: ignore[attr-defined]  # accelerate checks for it once, at prepare
    if parts.coordinator is not None:  # sharded parameters: TRL's generation helper takes the hooks off
        ds_param_attrs.sync_all([*parts.buckets, *parts.frozen])
        opt.parameter_offload = ParameterOffload(model, parts.coordinator, parts.units)  # type: ignore[attr-defined]
        flat = getattr(getattr(parts.grad_sync, "accum", None), "flat", None)
        if flat is not None:  # DeepSpeed's stage 3 sums the rank's gradient partitions in one flat buffer too
            opt.grad_partitions_flat_buffer = flat  # type: ignore[attr-defined]
    elif stage.shard_optimizer:  # ZeRO-1/2: the parameters are views of flat buffers, DeepSpeed's bit16_groups_flat
        flat_groups.expose(opt, parts.buckets)
        accum = getattr(parts.grad_sync, "accum", None)  # the sharded reducer's sums (stage 2; 1 with offload)
        if isinstance(accum, ShardAccumulator) and accum.home is not None:  # optimizer offload
            opt.accumulated_grads_in_cpu = HostGradSums(accum, engine)  # type: ignore[attr-defined]


def _attach_loader(engine: Engine, training_data: Dataset[Any] | None,
                   collate_fn: Callable[..., Any] | None) -> TrainingDataLoader | None:
    if training_data is None:
        return None
    loader = build_dataloader(training_data, engine.train_micro_batch_size_per_gpu(), engine.ctx.rank,
                              engine.ctx.world_size, collate_fn)
    engine.training_dataloader = loader
    return loader


def _initialize_inference(ctx: DistContext, coll: Collectives, model: nn.Module, cfg: ZerorunConfig,
                          stage: StagePolicy, precision: PrecisionPolicy, lr_scheduler: SchedulerArg | None,
                          training_data: Dataset[Any] | None, collate_fn: Callable[..., Any] | None
                          ) -> tuple[Engine, None, TrainingDataLoader | None, None]:
    """No optimizer anywhere: an engine for forward passes (:mod:`zerorun.engine.inference`)."""
    if lr_scheduler is not None or cfg.scheduler is not None:
        raise EngineError("a learning-rate scheduler was given, but no optimizer for it to drive",
                          "drop the scheduler (and the config's `scheduler` block) for a forward-only model, "
                          "or pass an optimizer / add an `optimizer` block to train it")
    parts = build_inference_parts(model, coll, stage, precision, cfg.zero_optimization, ctx.device)
    ds_param_attrs.sync_all(parts.frozen)
    if parts.coordinator is not None:
        install_module_surface(model, parts.coordinator)
    engine = InferenceEngine(model, None, cfg, ctx, coll, stage, precision, parts)
    _compile_if_configured(engine, cfg)
    return engine, None, _attach_loader(engine, training_data, collate_fn), None
