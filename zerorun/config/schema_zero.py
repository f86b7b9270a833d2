"""The ``zero_optimization`` block and its two offload sub-blocks (DeepSpeed's keys).

Every field's description is its documentation; ``zerorun print-config`` shows the
defaults. Sizes are in elements, not bytes, as in DeepSpeed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from zerorun.config.values import Bool, Fraction, Int, NonNegInt, PosInt, Str, choice

OffloadDevice = Annotated[Literal["none", "cpu", "nvme"], BeforeValidator(choice("none", "cpu", "nvme"))]
Stage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(choice(0, 1, 2, 3))]

STAGE3_ONLY_KEYS = (
    "zero_hpz_partition_size",
    "mics_shard_size",
    "mics_hierarchical_params_gather",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_model_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save",
    "sub_group_size",
    "zero_quantized_weights",
    "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients",
    "stage3_module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params",
)
"""Keys that only ZeRO stage 3 reads; set below stage 3 they have no effect."""


class Block(BaseModel):
    """A config block: unknown keys are errors, values are frozen once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class OffloadBlock(Block):
    """The keys both offload blocks share: the device, the NVMe directory, pinning."""

    device: OffloadDevice = Field("none", description="none (GPU), cpu, or nvme (files under nvme_path).")
    nvme_path: Str | None = Field(
        None, description="Directory on a fast local NVMe; required with device nvme."
    )
    pin_memory: Bool = Field(
        False,
        description="Page-locked CPU buffers (faster copies, more locked host memory). DeepSpeed >= 0.19.5 defaults to true.",
    )


class OffloadOptimizerConfig(OffloadBlock):
    """Where the fp32 master shard and the optimizer state live (ZeRO-Offload / ZeRO-Infinity)."""

    buffer_count: NonNegInt = Field(4, description="Number of buffers for optimizer-state swapping to NVMe.")
    fast_init: Bool = Field(False, description="Faster optimizer initialisation when offloading to NVMe.")
    ratio: Fraction = Field(1.0, description="Fraction of the optimizer state offloaded (< 1 needs stage 3).")
    pipeline_read: Bool = Field(False, description="Overlap NVMe reads of the optimizer state with the step.")
    pipeline_write: Bool = Field(
        False, description="Overlap NVMe writes of the optimizer state with the step."
    )

    @property
    def pipeline(self) -> bool:
        """DeepSpeed's derived ``pipeline``: NVMe reads or writes overlap the step."""
        return bool(self.pipeline_read or self.pipeline_write)


class OffloadParamConfig(OffloadBlock):
    """Where the 16-bit parameter shards live between uses (stage 3 only)."""

    buffer_count: NonNegInt = Field(5, description="Number of buffers in the parameter swap pool (NVMe).")
    buffer_size: NonNegInt = Field(
        100_000_000, description="Elements per buffer of the parameter swap pool (NVMe)."
    )
    max_in_cpu: NonNegInt = Field(
        1_000_000_000, description="Parameter elements kept in CPU memory when offloading to NVMe."
    )


DEFAULT_LEAF_MODULE_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)
"""DeepSpeed 0.19.8's default leaf classes: Hugging Face MoE blocks, whose experts run data-dependently."""


def _str_list(value: object) -> object:
    """One string stands for a list of one, as DeepSpeed's leaf_module block reads it."""
    return [value] if isinstance(value, str) else value


Names = Annotated[list[str], BeforeValidator(_str_list)]


class LeafModuleConfig(Block):
    """Stage 3 modules gathered as one unit with their whole subtree (``deepspeed.utils.set_z3_leaf_modules``)."""

    classes: Names = Field(default_factory=lambda: list(DEFAULT_LEAF_MODULE_CLASSES),
                           description="Class names or fully qualified class names (default: Hugging Face MoE blocks).")
    names: Names = Field(default_factory=list, description="Module names as model.named_modules() gives them.")
    name_suffixes: Names = Field(default_factory=list, description="Suffixes of module names.")


class ZeroConfig(Block):
    """ZeRO: which model states are partitioned across the data-parallel ranks."""

    stage: Stage = Field(
        0,
        description="0: plain data parallel; 1: optimizer state partitioned; 2: + gradients; 3: + parameters.",
    )
    contiguous_gradients: Bool = Field(
        True, description="Copy gradients into one contiguous buffer as they are produced."
    )
    reduce_scatter: Bool = Field(
        True, description="Reduce gradients with reduce-scatter instead of all-reduce (stages 1-2)."
    )
    reduce_bucket_size: NonNegInt = Field(
        500_000_000, description='Elements reduced at a time. "auto": hidden_size^2.'
    )
    allgather_partitions: Bool = Field(
        True, description="All-gather updated partitions at the end of the step (stages 1-2)."
    )
    allgather_bucket_size: NonNegInt = Field(
        500_000_000,
        description="Elements all-gathered at a time (stages 1-2; stage 3 uses stage3_prefetch_bucket_size).",
    )
    overlap_comm: Bool | None = Field(
        None,
        description="Overlap gradient reduction with the backward pass. Unset: true at stage 3, false below.",
    )
    load_from_fp32_weights: Bool = Field(
        True, description="Initialise the fp32 master from the checkpoint's fp32 copy."
    )
    elastic_checkpoint: Bool = Field(
        False, description="Load a checkpoint saved with a different world size (stages 1-2)."
    )
    pipeline_loading_checkpoint: Bool = Field(
        False, description="Stage 3: load a pipeline-parallel checkpoint into the module (DeepSpeed's key)."
    )
    round_robin_gradients: Bool = Field(
        False, description="Stage 1-2 gradient partitioning in round-robin order (CPU offload)."
    )
    ignore_unused_parameters: Bool = Field(
        True, description="Tolerate parameters that get no gradient (stage 2)."
    )
    zero_hpz_partition_size: NonNegInt = Field(
        1, description="Stage 3, ZeRO++ hpZ: after a unit's forward keep a secondary copy of its parameters "
        "sharded over this many ranks of one node; backward gathers from it. 0 and 1: off.",
    )
    mics_shard_size: Int = Field(
        -1, ge=-1, description="Stage 3, MiCS: shard parameters, gradients and optimizer state inside groups "
        "of this many ranks, replicated across the groups. -1 and 0: off (the world is one group).",
    )
    mics_hierarchical_params_gather: Bool = Field(
        False, description="Stage 3, MiCS: all-gather parameters in two hops, across nodes then inside each.",
    )
    sub_group_size: PosInt = Field(
        1_000_000_000, description="Elements per optimizer-step tile with offload at stage 3 (ZeRO-Infinity)."
    )
    offload_optimizer: OffloadOptimizerConfig = Field(
        default_factory=OffloadOptimizerConfig, description="Optimizer-state offload (stages 1-3)."
    )
    offload_param: OffloadParamConfig = Field(
        default_factory=OffloadParamConfig, description="Parameter offload (stage 3 only)."
    )
    stage3_prefetch_bucket_size: NonNegInt = Field(
        50_000_000,
        description='Stage 3: elements of parameters prefetched ahead of use. "auto": int(0.9 * hidden_size^2). '
        "DeepSpeed's docs say 5e8; its code uses 5e7.",
    )
    stage3_param_persistence_threshold: NonNegInt = Field(
        100_000,
        description='Stage 3: parameters with fewer elements stay gathered. "auto": 10 * hidden_size.',
    )
    stage3_model_persistence_threshold: NonNegInt = Field(
        2**63 - 1,
        description="Stage 3: cap on the total elements kept gathered by the persistence threshold.",
    )
    stage3_max_live_parameters: NonNegInt = Field(
        1_000_000_000, description="Stage 3: most gathered parameter elements held at once."
    )
    stage3_max_reuse_distance: NonNegInt = Field(
        1_000_000_000,
        description="Stage 3: keep a gathered parameter if it is used again within this many elements of fetches.",
    )
    stage3_gather_16bit_weights_on_model_save: Bool = Field(
        False, description="Stage 3: gather the full 16-bit weights when saving the model."
    )
    # ZeRO++'s quantized communication (docs/zeropp.md); DeepSpeed reads them at stage 3 only
    zero_quantized_weights: Bool = Field(
        False,
        description="Stage 3 (ZeRO++ qwZ): all-gather non-persistent parameters as int8 blocks with an fp32 "
        "scale per 2048 elements (half of bf16's bytes); error per element at most max|block|/254.",
    )
    zero_quantized_nontrainable_weights: Bool = Field(
        False,
        description="Stage 3 (ZeRO++): keep the shards of frozen parameters (requires_grad=False) as int8 blocks "
        "at rest, gathered quantized and dequantized on arrival.",
    )
    zero_quantized_gradients: Bool = Field(
        False,
        description="Stage 3 (ZeRO++ qgZ): reduce-scatter gradients as an all-to-all of int8 blocks, "
        "dequantized and summed in fp32 by the receiving rank.",
    )
    leaf_module: LeafModuleConfig = Field(
        default_factory=LeafModuleConfig,
        description="Stage 3: modules (by class, name or name suffix) gathered as one unit with their subtree.",
    )
    stage3_module_granularity_threshold: NonNegInt = Field(
        0, description="Stage 3: flag as leaf every module whose parameters per layer are at most this (0: off).",
    )
    memory_efficient_linear: Bool = Field(
        True, description="Stage 3: DeepSpeed's F.linear that saves no gathered weight for backward (zerorun's "
        "gathers release theirs already).",
    )
    stage3_use_all_reduce_for_fetch_params: Bool = Field(
        False, description="Stage 3: fetch parameters with an all-reduce instead of an all-gather (the same values).",
    )
