"""The smaller config blocks: precision, optimizer, scheduler, and the DeepSpeed
blocks zerorun accepts for compatibility (aio, activation checkpointing, flops
profiler, checkpoint, the communication logger)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from zerorun.config.dtypes import dtype_choice
from zerorun.config.schema_zero import Block
from zerorun.config.suggest import did_you_mean
from zerorun.config.values import (
    Bool,
    Float,
    Int,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Str,
    fail,
    show,
    word_choice,
)

OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "RMSprop")
"""Optimizer ``type`` values: the ``torch.optim`` classes (DeepSpeed matches them case-insensitively)."""

UNSUPPORTED_OPTIMIZERS = {
    "lamb": "Lamb optimizer", "fusedlamb": "Lamb optimizer", "onebitadam": "1-bit Adam optimizer",
    "zerooneadam": "0/1 Adam optimizer", "onebitlamb": "1-bit Lamb optimizer", "lion": "Lion optimizer",
    "muon": "Muon optimizer", "muadam": "MuAdam optimizer", "muadamw": "MuAdamW optimizer", "musgd": "MuSGD optimizer",
}
"""DeepSpeed's optimizer ``type`` names (lower case) that zerorun does not implement, and what they are."""

SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
"""Scheduler ``type`` values, DeepSpeed's names."""


def _named(kind: str, names: tuple[str, ...], unsupported: dict[str, str] | None = None) -> Any:
    """A validator for a type name matched case-insensitively, returned in canonical spelling."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise fail(f"expected a {kind} name, got {show(value)}")
        for name in names:
            if name.lower() == value.lower():
                return name
        if unsupported and value.lower() in unsupported:
            raise fail(f"{show(value)} is DeepSpeed's {unsupported[value.lower()]}, which zerorun does not "
                       f"implement; use one of {', '.join(names)}, or pass your own optimizer to initialize()")
        suggestion = did_you_mean(value, names, case_insensitive=True)
        hint = f" (did you mean {suggestion}?)" if suggestion else ""
        raise fail(f"unknown {kind} {show(value)}{hint}; known: {', '.join(names)}")

    return check


class Fp16Config(Block):
    """fp16 mixed precision with loss scaling."""

    enabled: Bool = Field(False, description="Train with fp16 parameters and gradients, fp32 master weights.")
    auto_cast: Bool = Field(False, description="Cast the forward inputs to fp16.")
    loss_scale: NonNegFloat = Field(0.0, description="Static loss scale; 0 means dynamic loss scaling.")
    initial_scale_power: NonNegInt = Field(
        16, description="Dynamic scaling starts at 2**initial_scale_power."
    )
    loss_scale_window: PosInt = Field(1000, description="Steps without overflow before the scale is doubled.")
    hysteresis: PosInt = Field(2, description="Overflows tolerated before the scale is lowered.")
    consecutive_hysteresis: Bool = Field(
        False, description="Refill hysteresis after every step without overflow."
    )
    min_loss_scale: PosFloat = Field(1.0, description="The dynamic scale never goes below this.")
    fp16_master_weights_and_grads: Bool = Field(
        False, description="Keep master weights and gradients in fp16 (stage 1-3)."
    )


AutocastDtype = Annotated[Literal["bf16", "fp16"], BeforeValidator(dtype_choice("bf16", "fp16"))]
AnyDtype = Annotated[Literal["fp32", "fp16", "bf16"], BeforeValidator(dtype_choice("fp32", "fp16", "bf16"))]


class Bf16Config(Block):
    """bf16 mixed precision (no loss scaling needed)."""

    enabled: Bool = Field(False, description="Train with bf16 parameters and gradients, fp32 master weights.")
    immediate_grad_update: Bool = Field(
        False, description="Accumulate gradients into the fp32 copy right away."
    )
    check_grad_overflow: Bool = Field(True, description="Check bf16 gradients for inf/nan.")
    bf16_master_weights_and_grads: Bool = Field(
        False, description="Keep master weights and gradients in bf16 (ZeRO stage 1-3)."
    )
    bf16_optimizer_states: Bool = Field(
        False, description="Keep optimizer states in bf16 (needs bf16_master_weights_and_grads)."
    )
    master_compensation: Literal["none", "kahan", "stochastic_rounding"] = Field(
        "none", description="zerorun only: with bf16 masters, keep updates below half a bf16 ulp. kahan: a bf16 "
        "compensation buffer (+2 bytes/param); stochastic_rounding: round each new master stochastically "
        "(+0 bytes/param). Each chunk steps in fp32 temporaries of at most one bucket."
    )


class TorchAutocastConfig(Block):
    """``torch.autocast`` mixed precision (DeepSpeed 0.19.8's ``torch_autocast``): fp32 parameters, masters
    and gradients; the forward runs under ``torch.autocast`` in ``dtype``."""

    enabled: Bool = Field(False, description="Run the engine's forward under torch.autocast.")
    dtype: AutocastDtype | None = Field(
        None, description="bf16 (also bfloat16, torch.bfloat16; fp16 is refused); none: bf16.")
    lower_precision_safe_modules: list[str] | None = Field(
        None, description="Modules whose gradients DeepSpeed reduces in the autocast dtype; zerorun reduces in fp32."
    )


class AmpConfig(Block):
    """NVIDIA apex AMP (accepted for compatibility; zerorun does not run apex)."""

    enabled: Bool = Field(False, description="Use apex AMP. zerorun rejects true: use fp16 or bf16.")
    opt_level: Str = Field("O1", description="apex optimisation level.")
    loss_scale: Float | Str | None = Field(None, description="apex loss scale.")
    min_loss_scale: Float | None = Field(None, description="apex minimum loss scale.")
    max_loss_scale: Float | None = Field(None, description="apex maximum loss scale.")
    keep_batchnorm_fp32: Bool | None = Field(None, description="apex: keep batch norm in fp32.")
    master_weights: Bool | None = Field(None, description="apex: keep fp32 master weights.")
    cast_model_type: AnyDtype | None = Field(None, description="apex: dtype to cast the model to (any spelling).")
    patch_torch_functions: Bool | None = Field(None, description="apex: patch torch functions.")
    verbosity: Int | None = Field(None, description="apex verbosity.")


class OptimizerConfig(Block):
    """The optimizer the engine builds over the rank's shard (``torch.optim`` class and kwargs)."""

    type: Annotated[str, BeforeValidator(_named("optimizer", OPTIMIZERS, UNSUPPORTED_OPTIMIZERS))] = Field(
        description=f"One of {', '.join(OPTIMIZERS)} (case-insensitive)."
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description='Keyword arguments of the optimizer (lr, betas, eps, weight_decay ...); "auto" values are dropped.',
    )


class SchedulerConfig(Block):
    """The learning-rate schedule, DeepSpeed's scheduler names and parameters."""

    type: Annotated[str, BeforeValidator(_named("scheduler", SCHEDULERS))] = Field(
        description=f"One of {', '.join(SCHEDULERS)}."
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the schedule (warmup_num_steps ...)."
    )


class AioConfig(Block):
    """Asynchronous I/O settings for NVMe offload."""

    block_size: PosInt = Field(1_048_576, description="Bytes per I/O request.")
    queue_depth: PosInt = Field(8, description="Outstanding I/O requests.")
    thread_count: PosInt = Field(1, description="I/O threads (DeepSpeed also calls it intra_op_parallelism).")
    single_submit: Bool = Field(False, description="Submit requests one at a time instead of in batches.")
    overlap_events: Bool = Field(True, description="Overlap submission and completion of requests.")
    use_gds: Bool = Field(False, description="Use GPUDirect Storage.")


class ActivationCheckpointingConfig(Block):
    """Activation checkpointing (applied by the model through the checkpointing API)."""

    partition_activations: Bool = Field(False, description="Partition checkpointed activations across ranks.")
    cpu_checkpointing: Bool = Field(False, description="Move checkpointed activations to CPU.")
    contiguous_memory_optimization: Bool = Field(
        False, description="Copy checkpoints into one contiguous buffer."
    )
    number_checkpoints: PosInt | None = Field(
        None, description="Checkpoints per forward (for the contiguous buffer)."
    )
    synchronize_checkpoint_boundary: Bool = Field(
        False, description="Synchronise at each checkpoint boundary."
    )
    profile: Bool = Field(False, description="Time the checkpointed forward and recompute.")


class CommsLoggerConfig(Block):
    """The communication logger (``zerorun.engine.comm.comms_logger``); ``deepspeed.comm.log_summary()``
    prints what it recorded."""

    enabled: Bool = Field(False, description="Record every profiled collective: count, latency, bandwidth.")
    prof_all: Bool = Field(True, description="Profile every collective (else only those named in prof_ops).")
    prof_ops: list[Str] = Field(default_factory=list, description="Collectives to profile by DeepSpeed's name "
                                                                  "(all_reduce, all_gather_into_tensor, ...).")
    verbose: Bool = Field(False, description="Log each recorded collective on rank 0 as it completes.")
    debug: Bool = Field(False, description="Log the script's deepspeed.comm calls with the calling function in "
                                           "the name (the engine's collectives keep their op names).")


class FlopsProfilerConfig(Block):
    """The flops profiler."""

    enabled: Bool = Field(False, description="Profile one step.")
    recompute_fwd_factor: NonNegFloat = Field(
        0.0, description="Extra forward cost of activation recomputation (0-1)."
    )
    profile_step: PosInt = Field(1, description="Which step to profile.")
    module_depth: Int = Field(-1, description="Depth of the per-module report; -1 for all.")
    top_modules: PosInt = Field(1, description="Modules listed per depth.")
    detailed: Bool = Field(True, description="Print the per-module tree.")
    output_file: Str | None = Field(None, description="Write the report to this file instead of stdout.")


TagValidation = Annotated[
    Literal["Ignore", "Warn", "Fail"],
    BeforeValidator(word_choice("Ignore", "Warn", "Fail", invalid="Checkpoint config contains invalid tag_validation "
                                                                  "value: ")),
]


class ParallelWriteConfig(Block):
    """How checkpoint shards are written."""

    pipeline_stage: Bool = Field(
        False, description="Write per pipeline stage (accepted; zerorun has no pipeline)."
    )


WriterType = Annotated[
    Literal["MOCK", "PYTHON", "FAST"],
    BeforeValidator(word_choice("MOCK", "PYTHON", "FAST")),
]
DataParallelUnit = Annotated[
    Literal["REPLICA", "SOCKET", "MACHINE"] | None,
    BeforeValidator(lambda v: v if v is None else word_choice("REPLICA", "SOCKET", "MACHINE")(v)),
]


class CheckpointWriterConfig(Block):
    """DeepSpeed 0.19.8's ``checkpoint.writer``: how checkpoint files are written (docs/checkpoints.md)."""

    type: WriterType = Field(
        "FAST", description="PYTHON and FAST both write with torch.save (fsynced, renamed); MOCK writes nothing "
                            "(a save then only takes its snapshot: for timing, never for training you keep)."
    )
    decoupled: Bool = Field(
        False, description="save_checkpoint returns after a host snapshot of this rank's state; a background "
                           "thread writes and commits it. The next save, load_checkpoint and process exit wait for it."
    )
    io_buffer_size: PosInt = Field(
        64 * 1024**2, description="Bytes per write call the background writer issues (DeepSpeed: its pinned "
                                  "I/O buffer)."
    )
    io_buffer_double: Bool = Field(
        True, description="Decoupled: hold up to two snapshots (one being written, one queued), so a save "
                          "waits only when both are busy; false holds one (a save waits for the previous write)."
    )
    show_statistics: Bool = Field(
        False, description="Rank 0 prints, per save, the time training was blocked, the write time and bytes."
    )
    data_parallel: DataParallelUnit = Field(
        None, description="DeepSpeed's writer placement (replica, socket, machine); every zerorun rank writes "
                          "only its own chunk, so no replica writes twice."
    )
    io_multiplier: PosInt = Field(1, description="DeepSpeed's I/O multiplier (accepted; no effect).")


class CheckpointConfig(Block):
    """Checkpoint behaviour."""

    tag_validation: TagValidation = Field(
        "Warn", description="Ranks saving under different tags: Fail raises on every rank; Warn warns and saves "
                            "under rank 0's tag (the checkpoint stays complete); Ignore saves under rank 0's tag."
    )
    load_universal: Bool = Field(False, description="Load a universal (world-size independent) checkpoint.")
    use_node_local_storage: Bool = Field(False, description="Each node writes to its own local storage.")
    parallel_write: ParallelWriteConfig = Field(
        default_factory=ParallelWriteConfig, description="Shard write options."
    )
    writer: CheckpointWriterConfig = Field(
        default_factory=CheckpointWriterConfig, description="How files are written; decoupled: true saves in "
                                                            "the background (DeepSpeed's DecoupledCheckpointEngine)."
    )


class CompileConfig(Block):
    """``torch.compile`` at ``initialize`` (DeepSpeed 0.13.2-0.14.3's ``compile`` keys: ``enabled``, ``backend``,
    ``kwargs``). DeepSpeed's DeepCompile keys (``deepcompile`` and its knobs) are handled before this block:
    ``deepcompile: true`` is refused, its knobs with it off are ignored with a warning."""

    enabled: Bool = Field(
        False, description="Compile the model at initialize, as engine.compile(backend, kwargs) would: stages 0-2 "
                           "the whole module, stage 3 each repeated block's forward (its gathers stay eager)."
    )
    backend: Str = Field("inductor", description="torch.compile's backend (inductor, aot_eager, eager, ...).")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="torch.compile's keyword arguments (mode, fullgraph, dynamic, options)."
    )
