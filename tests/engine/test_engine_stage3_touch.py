"""Stage 3 on models that read parameters outside their own module, and on frozen-base + adapter models.

One spawned gloo group per world size (2, 3) runs every case; each is compared, step by
step, with plain single-process PyTorch on the same global batch (fp32: losses rtol 1e-5,
parameters rtol 1e-5 elementwise and an L2 distance under 1e-4):

* the tiny GPT of ``examples/train_gpt.py``: tied embeddings and ``nn.MultiheadAttention``,
  whose forward reads ``out_proj.weight`` without calling ``out_proj`` (gradient
  accumulation 1 and 3, prefetch off and on);
* ``Reader``: a unit computing ``F.linear(x, sibling.weight, self.bias)`` with a sibling
  Linear it never calls, and a root forward ending in ``F.linear(h, self.emb.weight)``;
* ``LoRANet``: frozen base Linears with trainable low-rank adapters; the frozen weights
  are sharded too (1/N of their bytes per rank), and a checkpoint round-trip keeps them.

Touched buckets are gathered on touch in the first step only: from then on the unit that
touched them lists them (gathered and prefetched with it). Outside forward/backward the
same reads fail with ShardedParameterError. The set-up test counts the bytes stage 3
moves to the device (every move goes through ``zerorun.engine.mechanism.placement.to_device``):
at every move, what is on the device is at most the largest unit plus this rank's shards,
and ``model.to(device)`` is never called on the whole model. There is no GPU here: the
device is the CPU, so the bound is checked from the engine's own counted bytes, not from
a CUDA allocator.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.dist_harness import run_distributed
from tests.engine.test_engine_stage3_cases import MICRO_BATCH, VOCAB, global_batch, make_model, rank_rows
from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS

STEPS = 3
LR = 5e-2
DIM = 16


class Reader(nn.Module):
    """Owns only a bias; its weight is a sibling module's (which is never called)."""

    def __init__(self, source: nn.Linear) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(source.out_features) * 0.1)
        self.source = [source]  # a list: not a registered child, just a reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.source[0].weight, self.bias)


class ReaderNet(nn.Module):
    """Root forward ends in ``F.linear(h, self.emb.weight)``: a tied head without a head module."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.body = nn.Linear(DIM, DIM)
        self.spare = nn.Linear(DIM, DIM)  # only ever read by ``reader``
        self.reader = Reader(self.spare)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.reader(torch.tanh(self.body(self.emb(idx)))))
        return F.linear(h, self.emb.weight)


class LoRALinear(nn.Module):
    def __init__(self, din: int, dout: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(din, dout)
        self.base.requires_grad_(False)
        self.a = nn.Linear(din, rank, bias=False)
        self.b = nn.Linear(rank, dout, bias=False)  # random, not zero: every adapter moves from step one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.b(self.a(x))


class LoRANet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.emb.requires_grad_(False)
        self.layers = nn.ModuleList(LoRALinear(DIM, DIM) for _ in range(6))
        self.head = LoRALinear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return self.head(x)


def build(kind: str) -> nn.Module:
    if kind == "gpt":
        return make_model("gpt")
    torch.manual_seed(99)
    return ReaderNet() if kind == "reader" else LoRANet()


@dataclass(frozen=True)
class Case:
    model: str
    gas: int
    prefetch: bool

    @property
    def name(self) -> str:
        return f"{self.model}-gas{self.gas}-prefetch{int(self.prefetch)}"

    def config(self) -> dict:
        return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": self.gas,
                "steps_per_print": 10**6, "gradient_clipping": 0.0,  # the reference does not clip
                "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0.9}},
                "zero_optimization": {"stage": 3, "overlap_comm": self.gas == 1,
                                      "stage3_prefetch_bucket_size": 400 if self.prefetch else 0,
                                      "stage3_max_live_parameters": 2000 if self.prefetch else 10**9,
                                      "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0}}


CASES = [Case("gpt", 3, False), Case("gpt", 1, True), Case("gpt", 3, True),
         Case("reader", 3, False), Case("reader", 1, True), Case("lora", 3, False), Case("lora", 1, True)]


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def reference(case: Case, world: int) -> tuple[list[float], list[torch.Tensor]]:
    """Plain PyTorch on the global batch; the optimizer holds the trainable parameters only."""
    model = build(case.model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = global_batch("gpt", step, MICRO_BATCH * world * case.gas)
        loss = _loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, [p.detach().clone() for p in model.parameters()]


def _outside_access_fails(model: nn.Module, kind: str) -> bool:
    from zerorun.engine.mechanism.guard import ShardedParameterError

    w = {"gpt": lambda: model.blocks[0].attn.out_proj.weight, "reader": lambda: model.spare.weight,
         "lora": lambda: model.layers[0].base.weight}[kind]()
    try:
        (w * 2).sum()
    except ShardedParameterError as e:
        return "GatheredParameters" in e.hint
    return False


def train(case: Case, rank: int, world: int) -> dict:
    import zerorun

    model = build(case.model)
    engine, *_ = zerorun.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                    config=case.config())
    coord = engine.parts.coordinator
    losses, touches = [], []
    for step in range(STEPS):
        x, y = global_batch("gpt", step, MICRO_BATCH * world * case.gas)
        before = coord.stats.touches
        for k in range(case.gas):
            sl = rank_rows(k, rank, world)
            loss = _loss(engine(x[sl]), y[sl])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        touches.append(coord.stats.touches - before)
    frozen = engine.parts.frozen
    out = {"losses": losses, "touches": touches, "outside_fails": _outside_access_fails(model, case.model),
           "memory": engine.memory_breakdown(), "fallbacks": coord.stats.fallbacks,
           "peak_live": coord.stats.peak_live_numel,
           "trainable_padded": sum(b.plan.padded_numel for b in engine.parts.buckets),
           "frozen_padded": sum(b.plan.padded_numel for b in frozen),
           "frozen_numel": sum(b.plan.numel for b in frozen),
           "frozen_held": sum(b.held_bytes() for b in frozen),
           "frozen_whole_now": sum(p.numel() for b in frozen for p in b.params)}
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        out["params"] = [p.detach().float().clone() for p in model.parameters()]
    if case.model == "lora" and case.gas == 1:
        out["checkpoint_keeps_frozen"] = _checkpoint_round_trip(engine, case, rank, out["params"])
    return out


def _checkpoint_round_trip(engine, case: Case, rank: int, trained: list[torch.Tensor]) -> bool:
    """Save, load into a freshly built engine, and compare every parameter (the frozen ones too)."""
    import torch.distributed as dist

    import zerorun

    root = os.path.join(tempfile.gettempdir(), f"zr-s3-lora-{os.getppid()}")
    engine.save_checkpoint(root, tag="t")
    model = build(case.model)
    with torch.no_grad():
        model.layers[0].base.weight.add_(1.0)  # a different frozen value: the load must overwrite it
    fresh, *_ = zerorun.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                   config=case.config())
    fresh.load_checkpoint(root, tag="t")
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        same = all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), trained, strict=True))
    dist.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return same


def setup_moves(init: bool) -> dict:
    """Count every set-up move to the device while a GPT is built (under zero.Init or not) and initialized."""
    import zerorun
    from zerorun.engine.mechanism.partition import PartitionedBucket
    from zerorun.engine.mechanism.placement import watch_moves

    case = Case("gpt", 1, False)
    model_calls: list[str] = []
    made: list[PartitionedBucket] = []  # every bucket built (zero.Init's too; retired ones hold 0 bytes)
    events: list[tuple[int, int]] = []  # (bytes the buckets hold just before the move, bytes moved)
    model_ref: list[nn.Module | None] = [None]
    orig_to, orig_init = nn.Module.to, PartitionedBucket.__init__

    def counting_to(self, *args, **kwargs):  # noqa: ANN001, ANN202 - records whole-model device moves
        to_device = "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args)
        if self is model_ref[0] and to_device:  # a dtype cast of the sharded model moves nothing
            model_calls.append(repr((args, kwargs)))
        return orig_to(self, *args, **kwargs)

    def recording_init(self, *args, **kwargs):  # noqa: ANN001, ANN202
        orig_init(self, *args, **kwargs)
        made.append(self)

    def observe(tensors: list[torch.Tensor], device: torch.device) -> None:
        events.append((sum(b.held_bytes() for b in made), sum(t.numel() * t.element_size() for t in tensors)))

    nn.Module.to = counting_to  # type: ignore[method-assign]
    PartitionedBucket.__init__ = recording_init  # type: ignore[method-assign]
    try:
        with watch_moves(observe):
            if init:
                with zerorun.zero.Init(config=case.config()):
                    model = make_model("gpt")
            else:
                model = make_model("gpt")
            model_ref[0] = model
            engine, *_ = zerorun.initialize(model=model, config=case.config())
    finally:
        nn.Module.to = orig_to  # type: ignore[method-assign]
        PartitionedBucket.__init__ = orig_init  # type: ignore[method-assign]
    buckets = engine.parts.buckets + engine.parts.frozen
    whole = make_model("gpt")
    return {"events": events, "model_to_calls": model_calls,
            "largest_unit": max(sum(p.numel() for p in m.parameters(recurse=False)) * 4 for m in whole.modules()),
            "shards": sum(b.local.numel() * b.local.element_size() for b in buckets),
            "param_bytes": sum(p.numel() * 4 for p in whole.parameters()),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers())}


def _run_all(rank: int, world: int) -> dict:
    out = {c.name: train(c, rank, world) for c in CASES}
    out["moves"] = {"plain": setup_moves(False), "init": setup_moves(True)}
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def runs(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    return request.param, run_distributed(_run_all, request.param, timeout=240)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_plain_pytorch(runs: tuple[int, list[dict]], case: Case) -> None:
    world, results = runs
    ref_losses, ref_params = reference(case, world)
    per_rank = [r[case.name] for r in results]
    n = world * case.gas
    losses = [sum(sum(r["losses"][s * case.gas:(s + 1) * case.gas]) for r in per_rank) / n for s in range(STEPS)]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    for rank, r in enumerate(per_rank):
        distance = torch.cat([(a - b).reshape(-1) for a, b in zip(r["params"], ref_params, strict=True)]).norm()
        assert distance < 1e-4, f"[rank {rank}] {case.name}: parameter distance {distance:.3g}"
        for got, want in zip(r["params"], ref_params, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert r["fallbacks"] == 0, "a touched bucket must not make later passes leave the recorded order"


@pytest.mark.parametrize("kind", ["gpt", "reader", "lora"])
def test_touched_buckets_are_gathered_on_touch_then_recorded(runs: tuple[int, list[dict]], kind: str) -> None:
    """Step 1 gathers on touch (MultiheadAttention's out_proj; the sibling weight and the tied head);
    from step 2 on the units that touched them gather them up front, so nothing is touched."""
    _, results = runs
    for r in results:
        for case in (c for c in CASES if c.model == kind):
            touches = r[case.name]["touches"]
            if kind == "lora":
                assert touches == [0] * STEPS, touches  # every parameter is read by its own module
            else:
                assert touches[0] > 0 and touches[1:] == [0] * (STEPS - 1), (case.name, touches)


@pytest.mark.parametrize("kind", ["gpt", "reader", "lora"])
def test_access_outside_forward_is_still_an_error(runs: tuple[int, list[dict]], kind: str) -> None:
    _, results = runs
    for r in results:
        for case in (c for c in CASES if c.model == kind):
            assert r[case.name]["outside_fails"], case.name


def test_frozen_weights_are_sharded(runs: tuple[int, list[dict]]) -> None:
    """LoRA at stage 3: each rank holds 1/N of the frozen base (fp32), nothing of it whole after a step,
    and the gathered elements never reach the whole frozen base (the window is a unit or two)."""
    world, results = runs
    plain = LoRANet()
    frozen_numel = sum(p.numel() for p in plain.parameters() if not p.requires_grad)
    for r in results:
        for case in (c for c in CASES if c.model == "lora"):
            res = r[case.name]
            assert res["frozen_numel"] == frozen_numel
            # padding only: 8 frozen buckets (emb, 6 bases, the head), aligned to ALIGN_ELEMENTS per slot and shard
            assert res["frozen_padded"] - frozen_numel < ALIGN_ELEMENTS * (world + 2) * 8
            assert res["frozen_held"] == 4 * res["frozen_padded"] // world, res
            assert res["frozen_whole_now"] == 0
            # backward releases a unit's frozen base once its inputs' gradients exist: at most a few
            # LoRALinear units (base + adapters, 336 elements) are ever gathered, never the 6 bases
            assert res["peak_live"] <= 3 * (DIM * DIM + DIM + 4 * DIM) + 4 * world, res
            assert res["memory"]["params"] == 4 * (res["frozen_padded"] + res["trainable_padded"]) // world
    for r in results:
        assert r["lora-gas1-prefetch1"]["checkpoint_keeps_frozen"]


@pytest.mark.parametrize("init", ["plain", "init"])
def test_setup_moves_one_unit_at_a_time(runs: tuple[int, list[dict]], init: str) -> None:
    """Device bytes at every set-up move <= the largest unit + this rank's shards (+ the buffers moved)."""
    _, results = runs
    for rank, r in enumerate(results):
        m = r["moves"][init]
        assert m["model_to_calls"] == [], f"[rank {rank}] model.to() was called: {m['model_to_calls']}"
        moved = sum(b for _, b in m["events"])
        if init == "plain":  # every parameter and buffer reaches the device exactly once
            assert moved == m["param_bytes"] + m["buffer_bytes"], m
        else:  # zero.Init moved each module as it was built (lm_head's weight before it was tied); initialize
            # adopts those shards, so no unit moves a second time
            assert m["param_bytes"] + m["buffer_bytes"] <= moved < 2 * m["param_bytes"] + m["buffer_bytes"], m
        for held, nbytes in m["events"]:
            assert nbytes <= max(m["largest_unit"], m["buffer_bytes"]), (held, nbytes)
            assert held + nbytes <= m["largest_unit"] + m["shards"] + m["buffer_bytes"], (held, nbytes, m)
