"""``engine.compile()`` at every stage: one graph at stages 0-2, one graph per block class at stage 3.

Two gloo ranks, one spawned group, backends that need no C++ toolchain (``aot_eager``: autograd
through the compiled graph; ``eager`` for the graph counts), each compiled run against the same
engine run eagerly (which the parity tests hold to single-process training):

* the 4-module toy model: ``torch._dynamo.explain`` of ``engine.forward`` at stages 0 and 2 (1 runs
  0's forward) is one graph with no break (the engine adds nothing to the forward: parameters are
  plain views of their buckets, gradients are taken by post-accumulate hooks outside the graph);
  then ``engine.compile(backend="aot_eager")`` trains as eager. At stage 3 the toy model has no
  repeated blocks, so it is compiled whole (a break at each unit's hooks), with a warning;
* a tiny GPT-shaped model (embedding, a ``ModuleList`` of 3 blocks, a head) at stage 3: each block
  becomes one gather unit and its forward one graph, shared by the 3 blocks: dynamo captures
  exactly 1 graph, with no break and no recompile, over 3 training steps;
* activation checkpointing around each block call, compiled: reentrant at stage 2 (inside the one
  graph) and stage 3, non-reentrant at stage 3 (the compiled block forward recomputed inside backward);
* the config's ``"compile": {"enabled": true, "backend": ...}`` compiles at ``initialize`` (the same
  regions, graph and losses), and an ``engine.compile()`` after it (accelerate's) changes nothing.

Losses: equal to eager's within 1e-5 (relative).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import MICRO_BATCH, global_batch, loss_fn, make_model, rank_rows

DIM, VOCAB, SEQ = 16, 32, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(DIM), nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


class Gpt(nn.Module):
    def __init__(self, ac: str = "") -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.h = nn.ModuleList(Block() for _ in range(3))
        self.norm = nn.LayerNorm(DIM)
        self.ac = ac  # "" | "reentrant" | "non_reentrant": torch.utils.checkpoint around each block call

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.h:
            x = block(x) if not self.ac else checkpoint(block, x, use_reentrant=self.ac == "reentrant")
        return self.norm(x) @ self.emb.weight.t()  # the tied head: a touch of the embedding's bucket


def _config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "steps_per_print": 10**6,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 60,
                                  "stage3_param_persistence_threshold": 0}}


def _toy_losses(engine, rank: int, world: int) -> list[float]:  # noqa: ANN001
    out = []
    for step in range(3):
        x, y = global_batch(step, MICRO_BATCH * world)
        sl = rank_rows(0, rank, world)
        loss = loss_fn(engine(x[sl]), y[sl])
        engine.backward(loss)
        engine.step()
        out.append(float(loss))
    return out


def _gpt_losses(engine, rank: int) -> list[float]:  # noqa: ANN001
    out = []
    for step in range(3):
        g = torch.Generator().manual_seed(50 + 10 * step + rank)
        tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=g)
        logits = engine(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        out.append(float(loss))
    return out


def _gpt(stage: int, ac: str, compiled: bool, from_config: bool = False) -> dict:
    import torch._dynamo

    import zerorun

    torch._dynamo.reset()
    torch.manual_seed(7)
    config = {**_config(stage), "compile": {"enabled": True, "backend": "aot_eager"}} if from_config else _config(stage)
    engine, _, _, _ = zerorun.initialize(model=Gpt(ac), config=config)
    if compiled:
        engine.compile(backend="aot_eager", compile_kwargs={})  # accelerate's call (a no-op after the config's)
    counters = torch._dynamo.utils.counters
    counters.clear()
    losses = _gpt_losses(engine, torch.distributed.get_rank())
    return {"losses": losses, "graphs": counters["stats"]["unique_graphs"],
            "breaks": sum(counters["graph_break"].values()), "recompiles": sum(counters["recompiles"].values()),
            "regions": list(engine.compiled_regions), "is_compiled": engine.is_compiled}


def _compile(rank: int, world: int) -> dict:
    import torch._dynamo

    import zerorun

    out: dict = {"toy": {}, "gpt": {}}
    for stage in (0, 2):  # stage 1 runs stage 0's forward
        torch._dynamo.reset()
        engine, _, _, _ = zerorun.initialize(model=make_model(), config=_config(stage))
        x = global_batch(0, MICRO_BATCH * world)[0][rank_rows(0, rank, world)]
        explained = torch._dynamo.explain(engine.forward)(x)
        eager, _, _, _ = zerorun.initialize(model=make_model(), config=_config(stage))
        compiled, _, _, _ = zerorun.initialize(model=make_model(), config=_config(stage))
        compiled.compile(backend="aot_eager")
        out["toy"][stage] = {
            "graphs": explained.graph_count, "breaks": explained.graph_break_count,
            "reasons": sorted({str(b.reason).splitlines()[0] for b in explained.break_reasons}),
            "eager": _toy_losses(eager, rank, world), "compiled": _toy_losses(compiled, rank, world),
        }
    engine, _, _, _ = zerorun.initialize(model=make_model(), config=_config(3))
    with pytest.warns(RuntimeWarning, match="no repeated blocks"):
        engine.compile(backend="eager")  # no blocks: compiled whole (trains: the parity of an earlier commit)
    out["toy_stage3_regions"] = engine.compiled_regions
    for stage, ac in ((3, ""), (2, "reentrant"), (3, "reentrant"), (3, "non_reentrant")):
        out["gpt"][(stage, ac)] = {"eager": _gpt(stage, ac, False), "compiled": _gpt(stage, ac, True)}
    out["from_config"] = {"initialize": _gpt(3, "", False, from_config=True),  # compiled by initialize
                          "then_compile": _gpt(3, "", True, from_config=True)}  # engine.compile() after: no-op
    return out


@pytest.mark.timeout(300)
def test_engine_compile_at_every_stage() -> None:
    for per_rank in run_distributed(_compile, 2, timeout=280):
        assert per_rank["toy_stage3_regions"] == [""]
        for stage, r in per_rank["toy"].items():
            assert (r["graphs"], r["breaks"]) == (1, 0), (stage, r["reasons"])
            assert r["compiled"] == pytest.approx(r["eager"], rel=1e-5), stage
        for (stage, ac), r in per_rank["gpt"].items():
            eager, compiled = r["eager"], r["compiled"]
            assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-5), (stage, ac)
            assert compiled["is_compiled"] and not eager["is_compiled"]
            if stage == 3:
                assert compiled["regions"] == ["h.0", "h.1", "h.2"]
            if (stage, ac) == (3, ""):
                # one graph for the 3 blocks, no break inside it, no recompile per block or bucket
                assert (compiled["graphs"], compiled["breaks"], compiled["recompiles"]) == (1, 0, 0), compiled
        eager = per_rank["gpt"][(3, "")]["eager"]
        for how, r in per_rank["from_config"].items():  # "compile": {"enabled": true} compiles at initialize
            assert r["is_compiled"] and r["regions"] == ["h.0", "h.1", "h.2"], how
            assert (r["graphs"], r["breaks"], r["recompiles"]) == (1, 0, 0), (how, r)
            assert r["losses"] == pytest.approx(eager["losses"], rel=1e-5), how
