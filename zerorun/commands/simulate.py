"""`zerorun simulate`: the real engine as one rank of a large world, on this machine, beside the estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from zerorun.commands.options import Json
from zerorun.errors import UsageError
from zerorun.estimate import parse_param_count

if TYPE_CHECKING:
    from zerorun.simulate.run import ModelChoice

WorldOpt = Annotated[int, typer.Option("--world", min=1, help="Ranks in the simulated world.")]
RankOpt = Annotated[int, typer.Option("--rank", min=0, help="The rank this process plays.")]
MetaOpt = Annotated[bool, typer.Option(
    "--meta", help="Compute on the meta device: no storage, any size in seconds, no physical peaks.")]
ModelOpt = Annotated[Path | None, typer.Option(
    "--model", help="A Hugging Face config.json (built with from_config; no weights are downloaded).")]
ParamsOpt = Annotated[str | None, typer.Option(
    "--params", help="A built-in decoder of this size: 70B, 7B, 1.5B (with --family).")]
FamilyOpt = Annotated[str, typer.Option("--family", help="The built-in decoder's layout: llama or gpt2.")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="A zerorun/DeepSpeed config \\[default: AdamW, bf16, one sample per rank].")]
StageOpt = Annotated[int | None, typer.Option(
    "--stage", min=0, max=3, help="Override the config's ZeRO stage \\[default: the config's, else 3].")]
StepsOpt = Annotated[int, typer.Option("--steps", min=1, help="Training steps after set-up.")]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", min=2, help="Tokens per sample.")]
GpusPerNodeOpt = Annotated[int, typer.Option(
    "--gpus-per-node", min=1, help="Ranks per node, for the bytes inside the node and across nodes.")]
HpzOpt = Annotated[int, typer.Option(
    "--hpz", min=1, help="Project ZeRO++ hpZ (the hpz partition size): backward gathers inside groups of N.")]
MicsOpt = Annotated[int, typer.Option(
    "--mics", min=0, help="Project MiCS (mics_shard_size): shard inside groups of N, replicate across them.")]
QwzOpt = Annotated[bool, typer.Option(
    "--qwz", help="Project ZeRO++ qwZ (zero_quantized_weights): int8 blockwise all-gathers of the weights.")]


def _model_choice(model: Path | None, params: str | None, family: str, seq_len: int,
                  micro_batch: int) -> ModelChoice:
    from zerorun.simulate import model as sm
    from zerorun.simulate.run import ModelChoice

    if (model is None) == (params is None):
        raise UsageError("give exactly one of --model config.json and --params SIZE",
                         hint="zerorun simulate --world 512 --params 70B --meta",
                         usage="zerorun simulate --world N (--model config.json | --params SIZE) [options]")
    if model is not None:
        shape = sm.hf_shape(model, seq_len, micro_batch)
        return ModelChoice(str(model), shape, shape.vocab, lambda: sm.HfLoss(sm.hf_model(model)))
    spec = sm.builtin_spec(parse_param_count(params), family, seq_len, micro_batch)  # type: ignore[arg-type]
    label = f"{spec.family} {params} (built-in, {spec.shape.layers} layers)"
    return ModelChoice(label, spec.shape, spec.shape.vocab, lambda: sm.Decoder(spec))


def command(
    world: WorldOpt,
    rank: RankOpt = 0,
    meta: MetaOpt = False,
    model: ModelOpt = None,
    params: ParamsOpt = None,
    family: FamilyOpt = "llama",
    config: ConfigOpt = None,
    stage: StageOpt = None,
    steps: StepsOpt = 2,
    seq_len: SeqLenOpt = 16,
    gpus_per_node: GpusPerNodeOpt = 8,
    hpz: HpzOpt = 1,
    mics: MicsOpt = 0,
    qwz: QwzOpt = False,
    as_json: Json = False,
) -> None:
    """Run the engine's real set-up and a few steps as rank R of N, in this one process.

    torch's fake process group stands in for the other ranks: every collective keeps
    its shapes and byte counts, not its values. Printed beside `zerorun estimate` for
    the same parameters, world and config: each memory term of
    engine.memory_breakdown(), the physical peak of set-up, forward, backward and step
    (CPU mode: the kernel's RSS high-water mark), communication per step and at set-up
    in Psi and bytes, and the time taken.

    What it shows is the real code path at (R, N): layout, padding, shard ranges, the
    bytes each rank holds, the sequence and size of collectives, the gather decisions,
    and on the CPU the real allocation peaks. It says nothing of numerics (losses are
    meaningless), agreement between ranks, deadlocks, timing, NCCL's buffers or the
    CUDA allocator. A script runs simulated unchanged with ZERORUN_SIMULATE=N
    (ZERORUN_SIMULATE_RANK, ZERORUN_SIMULATE_DEVICE=cpu|meta).

    At stage 3 each step's bytes are also split by collective kind into those moved
    inside the node and across nodes (--gpus-per-node), beside the estimate's.
    --hpz, --mics and --qwz project ZeRO++ and MiCS onto the plain stage-3
    collectives (the engine does not run them yet); under --mics the engine runs as
    one rank of its shard group. docs/zeropp.md has the rules.

    Examples:

      zerorun simulate --world 512 --params 70B --meta

      zerorun simulate --world 64 --params 1.5B --family gpt2 --stage 2 --meta --json

      zerorun simulate --world 512 --params 1B --config ds.json --steps 3

      zerorun simulate --world 512 --params 70B --meta --gpus-per-node 8 --hpz 8
    """
    from zerorun.estimate.topology import NodeLayout, Stage3Policy
    from zerorun.simulate import Simulation
    from zerorun.simulate.compare import compare
    from zerorun.simulate.report import render, to_json
    from zerorun.simulate.run import SimRequest, config_with_stage, run

    cfg = config_with_stage(config, stage)
    micro_batch = int(cfg.get("train_micro_batch_size_per_gpu") or 1)
    layout, policy = NodeLayout(world, gpus_per_node), Stage3Policy(hpz, mics, qwz)
    policy.check(layout)
    Simulation(world, rank)  # the rank is checked against the whole world, MiCS or not
    if not policy.plain and (stage if stage is not None else cfg.get("zero_optimization", {}).get("stage")) != 3:
        raise UsageError(f"{policy.label()} is a stage-3 policy", hint="add --stage 3",
                         usage="zerorun simulate --world N --params SIZE --stage 3 --hpz 8")
    choice = _model_choice(model, params, family, seq_len, micro_batch)
    shard = policy.shard_size(layout)  # MiCS: one rank of a shard group; its traffic is stage 3's there
    sim = Simulation(shard, rank % shard, "meta" if meta else "cpu")
    result = run(SimRequest(sim, choice, cfg, steps, seq_len))
    comparison = compare(result, cfg, choice.shape, layout, policy)
    if as_json:
        print(json.dumps(to_json(result, comparison), indent=2))
        return
    print("\n".join(render(result, comparison)))
