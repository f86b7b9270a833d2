"""`zerorun estimate`: per-GPU memory for every ZeRO stage and offload choice, term by term."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from zerorun.commands.options import Gpus, Json, Nodes
from zerorun.errors import ZerorunError
from zerorun.estimate import (
    ActivationPolicy,
    Dtype,
    EstimateRequest,
    Masters,
    ModelShape,
    Offload,
    Optimizer,
    Training,
    estimate,
    parse_bytes,
    parse_gpu_memory,
    parse_param_count,
    shape_from_hf_config,
)
from zerorun.estimate.buffers import Buckets, window_policy
from zerorun.estimate.cards import gpu_memory_note
from zerorun.estimate.counts import gib
from zerorun.estimate.from_config import config_facts
from zerorun.estimate.gpu import local_gpus
from zerorun.estimate.link_estimate import LinkEstimate, link_estimate, link_lines
from zerorun.estimate.topology import NodeLayout, Stage3Policy

Params = Annotated[str | None, typer.Option("--params", help="Parameter count: 14B, 7.5b, 350M, 1.3e9, 125000000.")]
DtypeOpt = Annotated[Dtype | None, typer.Option("--dtype", help="Compute dtype \\[default: the config's, else bf16].")]
OptimizerOpt = Annotated[
    Optimizer | None, typer.Option("--optimizer", help="Optimizer state size \\[default: the config's, else adam].")
]
MastersOpt = Annotated[Masters | None, typer.Option(
    "--masters", help="Master weights, their gradients and the moments: fp32, or bf16 "
    "(bf16.bf16_master_weights_and_grads + bf16_optimizer_states; -kahan/-stochastic: bf16.master_compensation) "
    "\\[default: the config's, else fp32].")]
OffloadOpt = Annotated[Offload | None, typer.Option(help="Pin the offload choice \\[default: show the usual variants].")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="A zerorun/DeepSpeed config: bucket sizes, dtype, optimizer.")]
ModelOpt = Annotated[Path | None, typer.Option("--model", help="A Hugging Face config.json: the shape and Ψ.")]
Int = Annotated[int | None, typer.Option(min=1, help="Model shape (with --hidden/--layers/--heads).")]
SeqLen = Annotated[int | None, typer.Option(min=1, help="Tokens per sample \\[default: the model's max_position_embeddings, else 2048].")]
MicroBatch = Annotated[int | None, typer.Option(min=1, help="Samples per GPU per step \\[default: 1].")]
Measure = Annotated[str | None, typer.Option(
    "--measure", metavar="'SCRIPT [ARGS]'",
    help="Also run SCRIPT under the engine for a few steps on --gpus local ranks and print estimated vs measured "
         "per term (one quoted string).", show_default=False)]
MeasureSteps = Annotated[int, typer.Option("--measure-steps", min=1, help="Optimizer steps of the --measure run.")]


def _shape(
    model: Path | None, hidden: int | None, layers: int | None, heads: int | None, extra: dict[str, int | None]
) -> ModelShape | None:
    seq_len, micro_batch = extra.pop("seq_len"), extra.pop("micro_batch") or 1
    if model is not None:
        return shape_from_hf_config(model, seq_len=seq_len, micro_batch=micro_batch)
    given = {"--hidden": hidden, "--layers": layers, "--heads": heads}
    if all(v is None for v in given.values()):
        return None
    missing = [flag for flag, v in given.items() if v is None]
    if missing:
        raise ZerorunError(
            f"the model shape needs {', '.join(missing)} as well",
            hint="give --hidden, --layers and --heads together (or --model config.json)",
        )
    known = {k: v for k, v in extra.items() if v is not None}
    return ModelShape(hidden=hidden, layers=layers, heads=heads, seq_len=seq_len or 2048, micro_batch=micro_batch,  # type: ignore[arg-type]
                      seq_source="--seq-len" if seq_len else "default", **known)


def _param_count(params: str | None, shape: ModelShape | None) -> int:
    if params is not None:
        return parse_param_count(params)
    if shape is not None and shape.vocab:
        return shape.param_count()
    raise ZerorunError(
        "the estimate needs the parameter count",
        hint="pass --params 14B, or --model config.json (or the shape flags with --vocab)",
    )


def _links(request: EstimateRequest, policy: Stage3Policy, buckets: Buckets) -> LinkEstimate:
    """Stage 3's bytes by kind inside the node and across nodes (``--gpus`` per node), under ``policy``."""
    t = request.training
    layout = NodeLayout(t.world_size, request.gpus_per_node)
    return link_estimate(t.params, t.dtype, t.optimizer, layout, policy, request.shape, window_policy(buckets))


def command(
    params: Params = None,
    gpus: Gpus = None,
    nodes: Nodes = 1,
    dtype: DtypeOpt = None,
    optimizer: OptimizerOpt = None,
    masters: MastersOpt = None,
    offload_optimizer: OffloadOpt = None,
    offload_param: OffloadOpt = None,
    offload_ratio: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Twin-Flow: the fraction of the optimizer state offloaded at stage 3, the rest "
        "stays on the GPU \\[default: the config's offload_optimizer.ratio, else 1].")] = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    hidden: Int = None,
    layers: Int = None,
    heads: Int = None,
    kv_heads: Int = None,
    ffn: Int = None,
    vocab: Int = None,
    seq_len: SeqLen = None,
    micro_batch: MicroBatch = None,
    activation_checkpointing: Annotated[bool, typer.Option(help="Keep only layer inputs; recompute one layer.")] = False,
    flash_attention: Annotated[bool, typer.Option(help="No s^2 attention scores kept.")] = False,
    fp32_grad_accum: Annotated[bool, typer.Option(
        help="Describe DeepSpeed's layout instead: 16-bit gradients plus an fp32 copy (its 18 B/param).")] = False,
    overhead: Annotated[str, typer.Option(help="CUDA context, cuBLAS, NCCL and allocator slack per GPU.")] = "1.5GiB",
    gpu_memory: Annotated[str | None, typer.Option(
        help="Memory per GPU: a card (3090, 4090, a100-40, a100-80, h100, h200, l40s, mi300x) or its label's "
             "size: 80GB = 80G = 80 = 80 GiB, as cards are labelled \\[default: NVML].")] = None,
    as_json: Json = False,
    plot: Annotated[Path | None, typer.Option(help="Also write the chart to FILE.png or FILE.svg.")] = None,
    measure: Measure = None,
    measure_steps: MeasureSteps = 3,
    hpz: Annotated[int, typer.Option(
        "--hpz", min=1, help="Stage 3 per link under ZeRO++ hpZ (zero_hpz_partition_size N).")] = 1,
    mics: Annotated[int, typer.Option(
        "--mics", min=0, help="Stage 3 per link and model states under MiCS (mics_shard_size N).")] = 0,
    qwz: Annotated[bool, typer.Option(
        "--qwz", help="Stage 3 per link under ZeRO++ qwZ (int8 blockwise weight all-gathers).")] = False,
) -> None:
    """Per-GPU memory for every ZeRO stage and offload choice, term by term.

    The rows describe the bundled engine (its fp32 gradient shard at stages 2-3);
    the ZeRO paper's arithmetic is printed below the table as a labelled reference.
    "fits" means within 95% of --gpu-memory, the same threshold the recommendation
    and autotune's pruning use. --measure runs the script and compares.

    Examples:

      zerorun estimate --params 14B --gpus 8 --gpu-memory 80GB

      zerorun estimate --model config.json --gpus 8 --seq-len 4096 --flash-attention --config ds.yaml

      zerorun estimate --gpus 2 --measure "examples/train_toy.py --config templates/zero2.yaml"
    """
    if measure is not None:  # the engine's own Ψ and config: the shape flags do not apply
        from zerorun.commands.measure import print_measurement, run_measurement

        print_measurement(run_measurement(measure, gpus or 1, config, measure_steps), as_json)  # local ranks
        return
    notes: list[str] = []
    shape = _shape(model, hidden, layers, heads, {"kv_heads": kv_heads, "ffn": ffn, "vocab": vocab, "seq_len": seq_len, "micro_batch": micro_batch})
    psi = _param_count(params, shape)
    local_count, local_memory = local_gpus()
    gpus = gpus or max(local_count, 1)
    facts = config_facts(config, world_size=gpus * nodes, hidden_size=shape.hidden if shape else None)
    memory = parse_gpu_memory(gpu_memory) if gpu_memory is not None else local_memory
    if memory is None:
        notes.append("no GPU memory known (no --gpu-memory, no local GPU): 'fits' is unknown")
    elif gpu_memory is None:
        notes.append(f"GPU memory read from the local GPUs through NVML: {gib(memory):.1f} GiB")
    else:
        notes.append(gpu_memory_note(gpu_memory, memory))
    if shape is None:
        notes.append("stage 3 gathers whole blocks; without the shape only the prefetch bucket is counted")
    # --hpz/--qwz describe stage 3's buffers too (the config's ZeRO++ keys otherwise)
    zeropp = {"zero_hpz_partition_size": hpz} if hpz > 1 else {}
    buckets = replace(facts.buckets, **zeropp, **({"zero_quantized_weights": True} if qwz else {}))
    request = EstimateRequest(
        training=Training(psi, gpus * nodes, dtype or facts.dtype or Dtype.BF16, optimizer or facts.optimizer or Optimizer.ADAM,
                          fp32_grad_accum, masters=masters or facts.masters or Masters.FP32),
        gpus_per_node=gpus,
        nodes=nodes,
        buckets=buckets,
        shape=shape,
        activation_policy=ActivationPolicy(activation_checkpointing, flash_attention),
        overhead=parse_bytes(overhead),
        gpu_memory=memory,
    )
    ratio = offload_ratio if offload_ratio is not None else facts.offload_ratio
    est = estimate(request, offload_optimizer, offload_param, ratio)
    links = _links(request, Stage3Policy(hpz, mics, qwz), facts.buckets)
    if plot is not None:
        from zerorun.estimate.plot import write_plot

        notes.append(f"chart written to {write_plot(est, plot)}")
    if as_json:
        print(json.dumps({**est.to_json(), "stage3_links": links.to_json()}, indent=2))
        return
    from rich.console import Console

    from zerorun.estimate.render import print_estimate

    console = Console(highlight=False)
    if not console.is_terminal:  # piped or captured: wide enough for every column
        console = Console(highlight=False, width=120)
    print_estimate(est, console, notes, None if config is None else str(config))
    if nodes > 1 or not links.policy.plain:
        for line in link_lines(links):
            console.print(line, markup=False, highlight=False)
