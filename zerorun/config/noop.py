"""Keys the schema accepts for DeepSpeed compatibility but the bundled engine never reads.

An existing ``ds_config.json`` must load unchanged, so these are not errors; but a
value that differs from the default would silently do nothing, so ``load_config``
warns once per key, naming it and what the engine does instead.
"""

from __future__ import annotations

from zerorun.config.problems import Problem, Severity
from zerorun.config.schema import ZerorunConfig

NO_EFFECT: dict[str, str] = {
    "zero_optimization.reduce_scatter": "gradients are always reduce-scattered (stages 2-3) or all-reduced",
    "zero_optimization.offload_optimizer.fast_init": "the optimizer state is created the one way",
    "zero_optimization.offload_optimizer.pipeline_read": "NVMe reads are always pipelined with the step",
    "zero_optimization.offload_optimizer.pipeline_write": "NVMe writes are always pipelined with the step",
    "zero_optimization.stage3_model_persistence_threshold": "only stage3_param_persistence_threshold is read",
    "zero_optimization.load_from_fp32_weights": "checkpoints always restore the fp32 masters they hold",
    "zero_optimization.elastic_checkpoint": "checkpoints always load into any world size",
    "zero_optimization.pipeline_loading_checkpoint": "zerorun runs no pipeline parallelism: a checkpoint loads "
                                                     "into the module the same way either way",
    "zero_optimization.contiguous_gradients": "gradients always live in flat per-bucket buffers",
    "zero_optimization.allgather_partitions": "parameters are always all-gathered bucket by bucket",
    "zero_optimization.allgather_bucket_size": "stages 1-2 all-gather the reduce_bucket_size buckets",
    "zero_optimization.round_robin_gradients": "each rank owns one contiguous chunk of every bucket",
    "zero_optimization.sub_group_size": "the optimizer steps one flat tensor per bucket",
    "zero_optimization.memory_efficient_linear": "no torch function is patched; a released bucket's bytes go "
                                                 "even while autograd holds views of it",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params": "parameters are fetched by all-gather, which gives "
                                                                "the same values",
    "zero_optimization.offload_param.buffer_size": "offloaded shards are read one unit at a time",
    "zero_optimization.offload_param.max_in_cpu": "NVMe parameter offload keeps no host cache",
    "data_types.grad_accum_dtype": "each stage accumulates gradients in its own fixed dtype (docs/compat.md, Not "
                                   "yet); stage 0 accepts only the training dtype, as DeepSpeed",
    "bf16.immediate_grad_update": "gradients are accumulated the one way the engine has",
    "bf16.check_grad_overflow": "every step checks the gradient norm for inf/nan",
    "torch_autocast.lower_precision_safe_modules": "gradients are reduced in fp32",
    "aio.block_size": "NVMe files are read and written with torch's file I/O",
    "aio.queue_depth": "NVMe files are read and written with torch's file I/O",
    "aio.thread_count": "NVMe I/O uses buffer_count threads",
    "aio.single_submit": "NVMe files are read and written with torch's file I/O",
    "aio.overlap_events": "NVMe files are read and written with torch's file I/O",
    "aio.use_gds": "NVMe files are read and written with torch's file I/O",
    "activation_checkpointing.contiguous_memory_optimization": "checkpoints keep no contiguous buffer",
    "activation_checkpointing.synchronize_checkpoint_boundary": "checkpoint boundaries do not synchronise",
    "activation_checkpointing.profile": "checkpointed regions are not timed",
    "flops_profiler.enabled": "there is no flops profiler; engine figures report throughput",
    "checkpoint.load_universal": "checkpoints always load at any world size",
    "checkpoint.use_node_local_storage": "checkpoints are written to the given directory",
    "checkpoint.parallel_write.pipeline_stage": "there is no pipeline",
    "checkpoint.writer.data_parallel": "every rank writes only its own chunk of the checkpoint",
    "checkpoint.writer.io_multiplier": "writes go through the file system, not DeepSpeed's async I/O",
    "zero_force_ds_cpu_optimizer": "any torch optimizer steps offloaded shards",
    "amp.opt_level": "apex AMP is not run (amp.enabled is refused)",
    "amp.loss_scale": "apex AMP is not run (amp.enabled is refused)",
    "amp.min_loss_scale": "apex AMP is not run (amp.enabled is refused)",
    "amp.max_loss_scale": "apex AMP is not run (amp.enabled is refused)",
    "amp.keep_batchnorm_fp32": "apex AMP is not run (amp.enabled is refused)",
    "amp.master_weights": "apex AMP is not run (amp.enabled is refused)",
    "amp.cast_model_type": "apex AMP is not run (amp.enabled is refused)",
    "amp.patch_torch_functions": "apex AMP is not run (amp.enabled is refused)",
    "amp.verbosity": "apex AMP is not run (amp.enabled is refused)",
    "flops_profiler.recompute_fwd_factor": "there is no flops profiler",
    "flops_profiler.profile_step": "there is no flops profiler",
    "flops_profiler.module_depth": "there is no flops profiler",
    "flops_profiler.top_modules": "there is no flops profiler",
    "flops_profiler.detailed": "there is no flops profiler",
    "flops_profiler.output_file": "there is no flops profiler",
}
"""Dotted key -> what the engine does regardless of it."""


def _value(cfg: ZerorunConfig, path: str) -> object:
    node: object = cfg
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def _default(path: str) -> object:
    node: object = ZerorunConfig()
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def keys_without_effect(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """A warning for each no-op key the file sets to something other than its default."""
    return [
        Problem(path, f"is accepted for DeepSpeed compatibility but has no effect in zerorun's engine "
                      f"({reason}); remove it", severity=Severity.WARNING)
        for path, reason in NO_EFFECT.items()
        if path in given and _value(cfg, path) != _default(path)
    ]

