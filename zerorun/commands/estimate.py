"""`zerorun estimate`: per-GPU memory for every ZeRO stage and offload choice, term by term."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from zerorun.errors import ZerorunError
from zerorun.estimate import (
    ActivationPolicy,
    Dtype,
    EstimateRequest,
    ModelShape,
    Offload,
    Optimizer,
    Training,
    estimate,
    parse_bytes,
    parse_param_count,
    shape_from_hf_config,
)
from zerorun.estimate.counts import gib
from zerorun.estimate.from_config import config_facts
from zerorun.estimate.gpu import local_gpus

Params = Annotated[str | None, typer.Option("--params", help="Parameter count: 14B, 7.5b, 350M, 1.3e9, 125000000.")]
Gpus = Annotated[int | None, typer.Option("--gpus", min=1, help="GPUs per node \\[default: the local GPUs, else 1].")]
Nodes = Annotated[int, typer.Option("--nodes", min=1, help="Number of nodes.")]
DtypeOpt = Annotated[Dtype | None, typer.Option("--dtype", help="Compute dtype \\[default: the config's, else bf16].")]
OptimizerOpt = Annotated[
    Optimizer | None, typer.Option("--optimizer", help="Optimizer state size \\[default: the config's, else adam].")
]
OffloadOpt = Annotated[Offload | None, typer.Option(help="Pin the offload choice \\[default: show the usual variants].")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="A zerorun/DeepSpeed config: bucket sizes, dtype, optimizer.")]
ModelOpt = Annotated[Path | None, typer.Option("--model", help="A Hugging Face config.json: the shape and Ψ.")]
Int = Annotated[int | None, typer.Option(min=1)]


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
    return ModelShape(hidden=hidden, layers=layers, heads=heads, seq_len=seq_len or 2048, micro_batch=micro_batch, **known)  # type: ignore[arg-type]


def _param_count(params: str | None, shape: ModelShape | None) -> int:
    if params is not None:
        return parse_param_count(params)
    if shape is not None and shape.vocab:
        return shape.param_count()
    raise ZerorunError(
        "the estimate needs the parameter count",
        hint="pass --params 14B, or --model config.json (or the shape flags with --vocab)",
    )


def command(
    params: Params = None,
    gpus: Gpus = None,
    nodes: Nodes = 1,
    dtype: DtypeOpt = None,
    optimizer: OptimizerOpt = None,
    offload_optimizer: OffloadOpt = None,
    offload_param: OffloadOpt = None,
    config: ConfigOpt = None,
    model: ModelOpt = None,
    hidden: Int = None,
    layers: Int = None,
    heads: Int = None,
    kv_heads: Int = None,
    ffn: Int = None,
    vocab: Int = None,
    seq_len: Int = None,
    micro_batch: Int = None,
    activation_checkpointing: Annotated[bool, typer.Option(help="Keep only layer inputs; recompute one layer.")] = False,
    flash_attention: Annotated[bool, typer.Option(help="No s^2 attention scores kept.")] = False,
    fp32_grad_accum: Annotated[bool, typer.Option(help="Count an fp32 gradient copy (DeepSpeed's 18 B/param).")] = False,
    overhead: Annotated[str, typer.Option(help="CUDA context, NCCL and allocator slack per GPU.")] = "1GiB",
    gpu_memory: Annotated[str | None, typer.Option(help="Memory per GPU, e.g. 80GB or 80GiB \\[default: NVML].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Also write the chart to FILE.png or FILE.svg.")] = None,
) -> None:
    """Per-GPU memory for every ZeRO stage and offload choice, term by term.

    Usage:

      zerorun estimate --params 14B --gpus 8 --gpu-memory 80GB

      zerorun estimate --model config.json --gpus 8 --seq-len 4096 --flash-attention --config ds.yaml
    """
    notes: list[str] = []
    shape = _shape(model, hidden, layers, heads, {"kv_heads": kv_heads, "ffn": ffn, "vocab": vocab, "seq_len": seq_len, "micro_batch": micro_batch})
    psi = _param_count(params, shape)
    local_count, local_memory = local_gpus()
    gpus = gpus or max(local_count, 1)
    facts = config_facts(config, world_size=gpus * nodes, hidden_size=shape.hidden if shape else None)
    memory = parse_bytes(gpu_memory) if gpu_memory is not None else local_memory
    if memory is None:
        notes.append("no GPU memory known (no --gpu-memory, no local GPU): 'fits' is unknown")
    elif gpu_memory is None:
        notes.append(f"GPU memory read from the local GPUs through NVML: {gib(memory):.1f} GiB")
    if shape is None:
        notes.append("activations not counted: give --model config.json or --hidden/--layers/--heads")
        notes.append("stage 3 gathers whole blocks; without the shape only the prefetch bucket is counted")
    request = EstimateRequest(
        training=Training(psi, gpus * nodes, dtype or facts.dtype or Dtype.BF16, optimizer or facts.optimizer or Optimizer.ADAM, fp32_grad_accum),
        gpus_per_node=gpus,
        nodes=nodes,
        buckets=facts.buckets,
        shape=shape,
        activation_policy=ActivationPolicy(activation_checkpointing, flash_attention),
        overhead=parse_bytes(overhead),
        gpu_memory=memory,
    )
    est = estimate(request, offload_optimizer, offload_param)
    if plot is not None:
        from zerorun.estimate.plot import write_plot

        notes.append(f"chart written to {write_plot(est, plot)}")
    if as_json:
        print(json.dumps(est.to_json(), indent=2))
        return
    from rich.console import Console

    from zerorun.estimate.render import print_estimate

    console = Console(highlight=False)
    if not console.is_terminal:  # piped or captured: wide enough for every column
        console = Console(highlight=False, width=120)
    print_estimate(est, console, notes)
