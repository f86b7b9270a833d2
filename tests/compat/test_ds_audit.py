"""The audit: every ``deepspeed`` name that transformers', accelerate's, TRL's and PEFT's DeepSpeed
integrations (grepped in their installed sources: ``deepspeed.``, ``ds_``, ``zero_``,
``parameter_offload``), DeepSpeedExamples' ``training/`` scripts (every ``deepspeed.*`` name and
``from deepspeed... import`` in its 110 Python files, at commit 45b4b715) and DeepSpeed-example-shaped
scripts use, and what zerorun does with it.

``AUDIT`` is the one source: docs/compat.md's table is rendered from it (this test fails when they
differ; ``python -m tests.compat.test_ds_audit`` prints the table). Each "works" name is imported and must
be zerorun's own object; each "unsupported" name must import and raise ``UnsupportedFeature`` naming
the feature when used. ``ELSEWHERE`` lists what other tests assert (named in each row), on engines
in use rather than on import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

T, A, R, P, X = "transformers", "accelerate", "TRL", "PEFT", "examples"
D = "DeepSpeed's tests"  # its tests/unit, run by bench/ds_unit.py

# (module, names, "works" or "unsupported: <alternative>", users)
AUDIT: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
    ("deepspeed", ("__version__", "initialize", "init_distributed", "add_config_arguments", "DeepSpeedEngine",
                   "DeepSpeedConfig", "comm", "zero", "runtime", "utils", "ops", "accelerator", "checkpointing",
                   "get_accelerator"),
     "works", (T, A, R, X)),
    ("deepspeed", ("DeepSpeedConfigError",), "works", (D,)),
    ("deepspeed", ("DeepSpeedTransformerLayer", "DeepSpeedTransformerConfig", "replace_transformer_layer"),
     "unsupported: no fused transformer kernels or kernel injection; train the model's own layers", (X,)),
    ("deepspeed.module_inject", ("replace_transformer_layer",), "unsupported: no kernel injection", (X,)),
    ("deepspeed", ("tp_model_init", "PipelineModule", "init_inference", "OnDevice"),
     "unsupported: data parallelism only (no tensor/pipeline parallelism, no inference engine)", (T, X)),
    ("deepspeed.comm", ("init_distributed", "is_initialized", "get_rank", "get_world_size", "all_reduce", "barrier"),
     "works", (T, A, X)),
    ("deepspeed.comm.config", ("DeepSpeedCommsConfig",), "works", (X,)),
    ("deepspeed.zero", ("GatheredParameters", "Init"), "works", (T, A, R, P)),
    ("deepspeed.runtime.zero.partition_parameters", ("ZeroParamStatus", "_orig_torch_arange",
                                                     "zero_wrapper_for_fp_tensor_constructor", "get_accelerator"),
     "works", (T, R)),
    ("deepspeed.runtime.zero.offload_config", ("OffloadDeviceEnum", "OffloadStateTypeEnum"), "works", (X,)),
    ("deepspeed.runtime.zero.offload_states", ("get_state_devices",), "works", (D,)),
    ("deepspeed.runtime.swap_tensor", ("MIN_SWAPPABLE_BYTES", "MIN_AIO_BYTES", "AIO_ALIGNED_BYTES"), "works", (D,)),
    ("deepspeed.runtime.engine", ("DeepSpeedEngine",), "works", (R,)),
    ("deepspeed.runtime.config", ("DeepSpeedConfig", "DeepSpeedConfigError", "ADAM_OPTIMIZER", "LAMB_OPTIMIZER",
                                  "DEEPSPEED_OPTIMIZERS", "get_gradient_clipping"), "works", (X, D)),
    ("deepspeed.runtime.data_pipeline.data_routing.helper", ("convert_to_random_ltd", "save_without_random_ltd"),
     "unsupported: no data efficiency (random-LTD)", (X,)),
    ("deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr",
     ("get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed",),
     "unsupported: no data efficiency (variable batch size); use a torch DataLoader", (X,)),
    ("deepspeed.runtime.domino.transformer", ("DominoTransformer",), "unsupported: no tensor parallelism (Domino)",
     (X,)),
    ("deepspeed.runtime.lr_schedules", ("VALID_LR_SCHEDULES", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                        "OneCycle", "LRRangeTest", "LR_RANGE_TEST_MIN_LR", "WARMUP_MAX_LR",
                                        "TOTAL_NUM_STEPS"), "works", (A, X, D)),
    ("deepspeed.runtime.utils", ("move_to_device", "set_random_seed", "see_memory_usage"), "works", (A, X)),
    ("deepspeed.runtime.dataloader", ("RepeatingLoader",), "works", (X,)),
    ("deepspeed.checkpoint.utils", ("clone_tensors_for_torch_save",), "works", (A,)),
    ("deepspeed.launcher.runner", ("DEEPSPEED_ENVIRONMENT_NAME", "main", "parse_args", "fetch_hostfile",
                                   "_parse_hostfile", "parse_resource_filter", "parse_inclusion_exclusion",
                                   "apply_num_nodes_and_gpus", "encode_world_info"), "works", (A, D)),
    ("deepspeed.launcher.multinode_runner", ("MultiNodeRunner",), "works", (D,)),
    ("deepspeed.launcher.multinode_runner", ("PDSHRunner", "OpenMPIRunner", "MPICHRunner", "IMPIRunner",
                                             "SlurmRunner", "MVAPICHRunner"),
     "unsupported: they build DeepSpeed's per-node launch; `deepspeed --launcher pdsh|openmpi|slurm` runs zerorun's",
     (D,)),
    ("deepspeed.utils.numa", ("parse_range_list",), "works", (D,)),
    ("deepspeed.env_report", ("main", "cli_main"), "works (`ds_report`)", (D,)),
    ("deepspeed.runtime.config_utils", ("DeepSpeedConfigModel",), "works", (A, D)),
    ("deepspeed.runtime.zero.config", ("DeepSpeedZeroConfig", "DeepSpeedZeroOffloadParamConfig",
                                       "DeepSpeedZeroOffloadOptimizerConfig"), "works", (A, D)),
    ("deepspeed.runtime.constants", ("GRADIENT_CLIPPING", "GRADIENT_CLIPPING_DEFAULT"), "works", (D,)),
    ("deepspeed.accelerator", ("get_accelerator",), "works", (T, X)),
    ("deepspeed.ops.adam", ("DeepSpeedCPUAdam", "FusedAdam"), "works", (A, X)),
    ("deepspeed.ops", ("__compatible_ops__",), "works (True for the Adam fronts, False for the rest)", (D,)),
    ("deepspeed.ops.adagrad", ("DeepSpeedCPUAdagrad",), "unsupported: use torch.optim.Adagrad", (A,)),
    ("deepspeed.ops.lion", ("DeepSpeedCPULion",), "unsupported: use a torch Lion optimizer", (A,)),
    ("deepspeed.ops.op_builder", ("CPUAdamBuilder", "AsyncIOBuilder", "FusedAdamBuilder"),
     "works (is_compatible() answers False; building raises)", (X,)),
    ("deepspeed.utils", ("logger", "log_dist", "safe_get_full_grad", "safe_get_full_fp32_param",
                         "safe_get_full_optimizer_state", "safe_set_full_fp32_param", "safe_set_full_optimizer_state",
                         "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
                         "safe_set_local_fp32_param", "safe_set_local_optimizer_state", "set_z3_leaf_modules",
                         "z3_leaf_module", "get_z3_leaf_modules", "RepeatingLoader"), "works", (T, A, P, X)),
    ("deepspeed.utils.logging", ("logger",), "works", (X,)),
    ("deepspeed.utils.groups", ("_get_sequence_parallel_group", "_get_sequence_parallel_rank",
                                "_get_sequence_parallel_world_size"),
     "unsupported: no sequence parallelism (ALST/Ulysses)", (A,)),
    ("deepspeed.runtime.sequence_parallel.ulysses_sp", ("UlyssesSPAttentionHF", "UlyssesSPDataLoaderAdapter"),
     "unsupported: no sequence parallelism (ALST/Ulysses)", (A,)),
    ("deepspeed.moe.utils", ("is_moe_param", "split_params_into_different_moe_groups_for_optimizer",
                             "split_params_into_shared_and_expert_params", "has_moe_layers"),
     "works (DeepSpeed's answers for a model without experts)", (X,)),
    ("deepspeed.moe.layer", ("MoE",), "unsupported: dense models only; flag HF MoE blocks with set_z3_leaf_modules",
     (X,)),
    ("deepspeed.utils.zero_to_fp32", ("get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
                                      "convert_zero_checkpoint_to_fp32_state_dict"), "works", (T, X)),
    ("deepspeed.checkpointing", ("checkpoint", "configure", "is_configured", "get_cuda_rng_tracker",
                                 "model_parallel_cuda_manual_seed"), "works", (X,)),
    ("deepspeed.pipe", ("PipelineModule", "LayerSpec"), "unsupported: no pipeline parallelism", (X,)),
    ("deepspeed.ops.sparse_attention", ("SparseSelfAttention", "BertSparseSelfAttention", "SparseAttentionUtils",
                                        "FixedSparsityConfig", "BigBirdSparsityConfig", "BSLongformerSparsityConfig",
                                        "VariableSparsityConfig", "DenseSparsityConfig"),
     "unsupported: use torch attention", (X,)),
    ("deepspeed.runtime.fp16.onebit", ("OnebitAdam",), "unsupported: use torch Adam", (X,)),
    ("deepspeed.profiling.flops_profiler", ("FlopsProfiler",), "unsupported: engine figures report throughput", (X,)),
]

ENGINE_MEMBERS = ("backward", "step", "zero_grad", "save_checkpoint", "load_checkpoint", "save_16bit_model",
                  "get_global_grad_norm", "set_gradient_accumulation_boundary", "is_gradient_accumulation_boundary",
                  "zero_optimization_stage", "zero_gather_16bit_weights_on_model_save", "gradient_accumulation_steps",
                  "train_micro_batch_size_per_gpu", "get_lr", "lr_scheduler", "module", "optimizer", "global_steps",
                  "local_rank", "set_train_batch_size", "empty_partition_cache", "torch_autocast_enabled",
                  "offload_states", "reload_states")
"""Engine members the integrations and scripts call (transformers, accelerate, TRL, examples)."""

ELSEWHERE = [
    ("parameter attributes", "`ds_shape`, `ds_numel`, `ds_status`, `ds_id`, `ds_tensor`, module "
                             "`ds_external_parameters`, `ds_active_sub_modules`", "TRL, PEFT, transformers",
     "works (tests/engine/test_ds_param_access.py, tests/scripts/test_ds_scripts_trl.py)"),
    ("engine", "`optimizer.parameter_offload`, `optimizer.overflow`, an engine without optimizer, dotted config "
               "keys", "TRL, accelerate",
     "works (tests/engine/test_engine_hf_surface.py, tests/config/test_config_load.py, tests/scripts/test_ds_scripts_trl.py)"),
    ("optimizer", "DeepSpeed's ZeRO buffers over zerorun's state: `single_partition_of_fp32_groups`, "
                  "`averaged_gradients`, `grad_partitions_flat_buffer`, `fp32_partitioned_groups_flat`, `fp16_groups`, "
                  "`parallel_partitioned_bit16_groups`, `bit16_groups_flat`, `accumulated_grads_in_cpu`, `optimizer`; "
                  "engine `allreduce_gradients()`", "DeepSpeed's tests, RLHF code",
     "works (tests/engine/test_partition_views.py, tests/engine/test_flat_groups.py, tests/engine/test_host_grad_sums.py)"),
    ("engine", "`compile(backend=, compile_kwargs=)`, `is_compiled`, the config's `compile` block "
               "(`enabled`, `backend`, `kwargs`)", "accelerate (HF Trainer `torch_compile=True`)",
     "works; stage 3 compiles each repeated block, the root stays eager; `deepcompile: true` refused "
     "(tests/engine/test_engine_compile.py, tests/scripts/test_ds_scripts_hf.py, tests/compat/test_compat_config.py)"),
]

BEGIN, END = "<!-- ds-audit:begin -->", "<!-- ds-audit:end -->"


def audit_table() -> str:
    rows = ["| module | names | zerorun | used by |", "|---|---|---|---|"]
    for module, names, status, users in AUDIT:
        rows.append(f"| `{module}` | {', '.join(f'`{n}`' for n in names)} | {status} | {', '.join(users)} |")
    rows.append(f"| engine | {', '.join(f'`{n}`' for n in ENGINE_MEMBERS)} | works | {T}, {A}, {R}, {X} |")
    for where, names, users, status in ELSEWHERE:
        rows.append(f"| {where} | {names} | {status} | {users} |")
    return "\n".join(rows)


COMPAT_DOC = ROOT / "docs" / "compat.md"


def test_compat_doc_table_is_rendered_from_the_audit() -> None:
    text = COMPAT_DOC.read_text()
    assert BEGIN in text and END in text, "docs/compat.md lacks the audit markers"
    section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert section == audit_table(), "docs/compat.md's DeepSpeed table differs from tests/compat/test_ds_audit.py: " \
                                     "paste `python -m tests.compat.test_ds_audit` between the markers"


TOUCH = """
import importlib, json, sys
from zerorun.errors import UnsupportedFeature
out = []
for module, names, status in json.loads(sys.argv[1]):
    mod = importlib.import_module(module)
    for name in names:
        value = getattr(mod, name)
        stand_in = type(type(value)).__name__ == "_StandIn" or hasattr(value, "__zerorun_unsupported__")
        if status.startswith("works"):
            out.append([module, name, "ok" if not stand_in else "stand-in"])
            continue
        try:
            value()
            out.append([module, name, "no error"])
        except UnsupportedFeature as e:
            out.append([module, name, "raises" if "not implemented by zerorun" in str(e) else str(e)])
print(json.dumps(out))
"""


def test_every_listed_name_imports_and_works_or_names_the_feature() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"ZERORUN_AS_DEEPSPEED": "1", "OMP_NUM_THREADS": "1"})
    rows = [[m, list(n), s] for m, n, s, _ in AUDIT]
    proc = subprocess.run([sys.executable, "-c", TOUCH, json.dumps(rows)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) == sum(len(n) for _, n, _, _ in AUDIT)
    bad = [g for g in got if g[2] not in ("ok", "raises")]
    assert bad == [], bad
    unsupported = {(m, n) for m, names, s, _ in AUDIT if s.startswith("unsupported") for n in names}
    assert {(m, n) for m, n, r in got if r == "raises"} == unsupported


def test_every_engine_member_is_there() -> None:
    import torch
    import torch.distributed as dist

    import zerorun

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    try:
        engine, *_ = zerorun.initialize(model=torch.nn.Linear(2, 2), config={
            "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
        missing = [n for n in ENGINE_MEMBERS if not hasattr(engine, n)]
        assert missing == []
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    print(audit_table())
