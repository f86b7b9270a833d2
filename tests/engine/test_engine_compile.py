"""torch.compile over the engine's forward: stages 0-2 stay one graph with no break.

Two gloo ranks. ``torch._dynamo.explain`` counts the graphs and breaks of ``engine.forward``
(the engine adds nothing to the forward at stages 0-2: parameters are plain views of their
buckets, gradients are taken by post-accumulate hooks outside the graph); then a few steps
with the forward compiled (``aot_eager``: autograd through the compiled graph, no C++
toolchain needed) must give the eager run's losses, so the hooks still see every gradient.
Stage 3 trains alike too, but is measured, not held to a graph count: on the 4-module toy
model, 25 graphs (gloo) / 20 (NCCL policy) as of this commit. The breaks: the autograd
graph-task id read by the gather coordinator (``gather.py``, 4), each gather's collective
(opaque to compile on purpose: one break per call, ``partition.py``), the shared-memory lane's
counter reads on gloo, and recompiles of ``PartitionedBucket.gather_async`` (guards on the
bucket's name, one per bucket, until dynamo's recompile limit of 8).
"""

from __future__ import annotations

import pytest

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows


def _config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "steps_per_print": 10**6,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 60,
                                  "stage3_param_persistence_threshold": 0}}


def _losses(engine, forward, rank: int, world: int) -> list[float]:  # noqa: ANN001
    out = []
    for step in range(3):
        x, y = global_batch(step, MICRO_BATCH * world)
        sl = rank_rows(0, rank, world)
        loss = loss_fn(forward(x[sl]), y[sl])
        engine.backward(loss)
        engine.step()
        out.append(float(loss))
    return out


def _compile(rank: int, world: int, stages: tuple[int, ...]) -> dict[int, dict]:
    import torch._dynamo

    import zerorun

    out = {}
    for stage in stages:
        torch._dynamo.reset()
        engine, _, _, _ = zerorun.initialize(model=make_model(), config=_config(stage))
        x = global_batch(0, MICRO_BATCH * world)[0][rank_rows(0, rank, world)]
        explained = torch._dynamo.explain(engine.forward)(x)
        eager, _, _, _ = zerorun.initialize(model=make_model(), config=_config(stage))
        compiled, _, _, _ = zerorun.initialize(model=make_model(), config=_config(stage))
        out[stage] = {
            "graphs": explained.graph_count, "breaks": explained.graph_break_count,
            "reasons": sorted({str(b.reason).splitlines()[0] for b in explained.break_reasons}),
            "eager": _losses(eager, eager.forward, rank, world),
            "compiled": _losses(compiled, torch.compile(compiled.forward, backend="aot_eager"), rank, world),
        }
    return out


@pytest.mark.timeout(300)
def test_stages_0_to_2_compile_to_one_graph_and_every_stage_trains_alike() -> None:
    for per_rank in run_distributed(_compile, 2, (0, 1, 2, 3), timeout=280):
        for stage, r in per_rank.items():
            if stage < 3:
                assert (r["graphs"], r["breaks"]) == (1, 0), (stage, r["reasons"])
            assert r["compiled"] == pytest.approx(r["eager"], rel=1e-5), stage
