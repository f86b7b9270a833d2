"""The whole config: DeepSpeed's top-level keys, each with its default and meaning.

This file and its two siblings (``schema_zero``, ``schema_blocks``) are the one
place where defaults are written down; ``zerorun print-config`` shows them.
Attribute names are DeepSpeed's keys so that engine code reads like DeepSpeed's docs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from zerorun.config.dtypes import dtype_choice
from zerorun.config.schema_blocks import (
    ActivationCheckpointingConfig,
    AioConfig,
    AmpConfig,
    Bf16Config,
    CheckpointConfig,
    CommsLoggerConfig,
    CompileConfig,
    FlopsProfilerConfig,
    Fp16Config,
    OptimizerConfig,
    SchedulerConfig,
    TorchAutocastConfig,
)
from zerorun.config.schema_zero import Block, ZeroConfig
from zerorun.config.values import Bool, Flag, NonNegFloat, PosFloat, PosInt, StepsOrNever, word_choice

CommDtype = Annotated[Literal["fp32", "fp16", "bf16"], BeforeValidator(dtype_choice("fp32", "fp16", "bf16"))]
AllreduceOp = Annotated[Literal["mean", "sum"],
                        BeforeValidator(word_choice("mean", "sum", invalid="Invalid gradient_allreduce_op: "))]



class DataTypesConfig(Block):
    """DeepSpeed's ``data_types`` block; zerorun reads ``grad_accum_dtype`` alone (``buffer_dtype`` is refused)."""

    grad_accum_dtype: CommDtype | None = Field(
        None, description="DeepSpeed's gradient accumulation dtype. Stage 0: must be the training dtype "
                          "(another raises, as in DeepSpeed); stages 1-3 keep their own accumulation dtype whatever it says.")


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class ZerorunConfig(Block):
    """A validated, resolved zerorun (DeepSpeed-compatible) config.

    The batch triple is ``None`` only where it cannot be known yet (no world size
    given); once loaded with a world size all three are ints with
    ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size``.
    """

    train_batch_size: PosInt | None = Field(
        None,
        description='Global samples per optimizer step = micro batch x accumulation x world size. "auto": derived.',
    )
    train_micro_batch_size_per_gpu: PosInt | None = Field(
        None, description='Samples per rank per forward/backward. "auto": derived from the other two.'
    )
    gradient_accumulation_steps: PosInt | None = Field(
        None,
        description='Micro batches accumulated per optimizer step (1 when it cannot be derived). "auto": derived.',
    )
    gradient_clipping: NonNegFloat = Field(
        1.0,
        description="Clip the global gradient norm to this value; 0 disables clipping. "
                    "Default 1.0 when the key is absent, as DeepSpeed >= 0.19.3 (it was 0.0 before).",
    )
    steps_per_print: StepsOrNever = Field(
        10, description="Log loss, learning rate and throughput every this many steps (Infinity: never)."
    )
    wall_clock_breakdown: Bool = Field(
        False, description="Time forward, backward and step separately (synchronises)."
    )
    memory_breakdown: Bool = Field(
        False, description="Log the model-state memory breakdown every steps_per_print."
    )
    optimizer: OptimizerConfig | None = Field(
        None,
        description="The optimizer to build; none when the script passes its own optimizer to initialize.",
    )
    scheduler: SchedulerConfig | None = Field(
        None, description="The learning-rate scheduler to build, if any."
    )
    fp16: Fp16Config = Field(default_factory=Fp16Config, description="fp16 mixed precision and loss scaling.")
    bf16: Bf16Config = Field(
        default_factory=Bf16Config, description="bf16 mixed precision (alias: bfloat16)."
    )
    torch_autocast: TorchAutocastConfig = Field(
        default_factory=TorchAutocastConfig, description="torch.autocast mixed precision (bfloat16)."
    )
    amp: AmpConfig = Field(default_factory=AmpConfig, description="apex AMP (accepted, not supported).")
    zero_optimization: ZeroConfig = Field(default_factory=ZeroConfig, description="ZeRO stage and its knobs.")
    aio: AioConfig = Field(default_factory=AioConfig, description="Asynchronous I/O for NVMe offload.")
    activation_checkpointing: ActivationCheckpointingConfig = Field(
        default_factory=ActivationCheckpointingConfig, description="Activation checkpointing."
    )
    flops_profiler: FlopsProfilerConfig = Field(
        default_factory=FlopsProfilerConfig, description="The flops profiler."
    )
    comms_logger: CommsLoggerConfig = Field(
        default_factory=CommsLoggerConfig, description="The communication logger (deepspeed.comm.log_summary)."
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoint behaviour."
    )
    communication_data_type: CommDtype | None = Field(
        None, description="dtype of gradient collectives (fp32, fp16, bf16, any DeepSpeed spelling); none: the training dtype."
    )
    prescale_gradients: Bool = Field(
        False, description="Divide gradients by the world size before reducing them."
    )
    gradient_predivide_factor: PosFloat = Field(
        1.0, description="Divide gradients by this before reducing and by world_size/factor after."
    )
    gradient_allreduce_op: AllreduceOp = Field(
        "mean", description="How ranks' gradients combine: mean (averaged over the world) or sum (added: no "
                            "division by the world size nor by gradient_predivide_factor; not with ZeRO stage 3)."
    )
    data_types: DataTypesConfig = Field(
        default_factory=DataTypesConfig, description="Gradient accumulation dtype (DeepSpeed's data_types block)."
    )
    zero_allow_untested_optimizer: Flag = Field(
        False, description="Allow a client optimizer that zerorun has not been tested with under ZeRO."
    )
    zero_force_ds_cpu_optimizer: Bool = Field(
        True, description="Accepted for compatibility; zerorun steps any torch optimizer on offloaded shards."
    )
    compile: CompileConfig = Field(
        default_factory=CompileConfig, description="torch.compile at initialize (enabled, backend, kwargs); "
                                                   "DeepCompile (deepcompile: true) is refused."
    )

    def get(self, key: str, default: Any = None) -> Any:
        """A top-level key read as from a dict: DeepSpeed's ``engine.config`` is the config dict, and
        integrations read it so (``engine.config.get("zero_optimization", {}).get("stage")``)."""
        if key not in type(self).model_fields:
            return default
        value = getattr(self, key)
        return value.model_dump() if isinstance(value, BaseModel) else value
