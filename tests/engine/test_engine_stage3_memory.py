"""Stage 3 frees what it releases, as the allocator sees it: structural checks in one process (world 1).

* After a forward, no tensor autograd saved still holds bytes of a released bucket
  (``F.linear`` saves ``weight.t()``, a view of the gathered buffer: releasing must free
  the buffer's storage itself, not only the engine's reference to it). Backward then
  reads the re-gathered values and training equals plain torch.
* Activation checkpointing, reentrant and not, with trainable and frozen (LoRA-style)
  parameters, with and without gradient accumulation: when a backward ends, before the
  engine's end-of-pass sweep, no unit is gathered and the gather coordinator holds
  nothing (each unit was released once autograd was done with it), and the training
  equals plain torch step by step.
* The step is bounded: each optimizer call steps at most one bucket's worth of
  parameters, and at most that many fp32 gradients exist at once (the temporaries of a
  foreach AdamW and of a 16-bit gradient's fp32 copy are proportional to both).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zerorun.engine.mechanism.param_state import ParamState

WIDTH, RANK = 24, 4
LR = 0.1  # SGD in the parity checks: Adam's first step turns gradients near its eps into large differences


@pytest.fixture(autouse=True, scope="module")
def _world_of_one() -> object:
    """These engines are worlds of one in this process: leave no process group to later modules."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _config(stage: int = 3, gas: int = 1, dtype: str = "fp32", optimizer: str = "SGD") -> dict:
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
           "optimizer": {"type": optimizer, "params": {"lr": LR}},
           "zero_optimization": {"stage": stage}}
    if stage == 3:  # every unit released right after use, nothing prefetched or kept: the strictest case
        cfg["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0,
                                        stage3_prefetch_bucket_size=0)
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


class Linears(nn.Module):
    """Eight Linear units: every one saves a view of its gathered weight for backward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.layers:
            x = F.relu(lin(x))
        return x


class Adapter(nn.Module):
    """A frozen base Linear plus a trainable low-rank path (LoRA's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(WIDTH, WIDTH)
        self.base.requires_grad_(False)
        self.down = nn.Linear(WIDTH, RANK, bias=False)
        self.up = nn.Linear(RANK, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


class Checkpointed(nn.Module):
    """An input projection, four checkpointed blocks (plain or adapter), a head."""

    def __init__(self, frozen: bool, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(WIDTH, WIDTH)  # trainable, so the blocks' inputs require grad (reentrant needs it)
        self.blocks = nn.ModuleList((Adapter() if frozen else nn.Linear(WIDTH, WIDTH)) for _ in range(4))
        self.head = nn.Linear(WIDTH, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks:
            x = x + torch.tanh(checkpoint(blk, x, use_reentrant=self.reentrant))
        return self.head(x)


def _batch(step: int, rows: int = 4) -> torch.Tensor:
    return torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(100 + step))


def _engine(model: nn.Module, cfg: dict):
    import zerorun

    engine, *_ = zerorun.initialize(model=model, config=cfg)
    return engine


def _full_values(engine, model: nn.Module) -> list[torch.Tensor]:
    import zerorun

    with zerorun.zero.GatheredParameters(list(model.parameters())):
        return [p.detach().clone() for p in model.parameters()]


def _reference(build, cfg: dict, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    model = build()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    gas, losses = cfg["gradient_accumulation_steps"], []
    for step in range(steps):
        opt.zero_grad()
        for k in range(gas):
            loss = model(_batch(step * gas + k)).square().mean()
            (loss / gas).backward()
            losses.append(loss.item())
        opt.step()
    return losses, [p.detach().clone() for p in model.parameters()]


def test_forward_leaves_no_bytes_of_a_released_bucket_in_autograd() -> None:
    torch.manual_seed(0)
    model = Linears()
    engine = _engine(model, _config())
    weight_views: list[torch.Tensor] = []  # saved tensors that share a (gathered) parameter's storage

    def pack(t: torch.Tensor) -> torch.Tensor:
        weights = {p.untyped_storage()._cdata for p in model.parameters() if p.numel() > 0}
        if t.untyped_storage()._cdata in weights:
            weight_views.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = engine(_batch(0)).square().mean()
    n = len(engine.parts.buckets)
    assert all(b.state is ParamState.SHARDED for b in engine.parts.buckets)  # reuse distance 0: all released
    # (never let a failing assert print these tensors: their storage may hold no bytes)
    views, held = len(weight_views), sum(t.untyped_storage().nbytes() for t in weight_views)
    weight_views.clear()
    assert views == n - 1, (views, n)  # every Linear but the first (its input needs no gradient) saved weight.t()
    assert held == 0, f"saved tensors still hold {held} bytes of released buckets"
    # backward re-gathers into the same storage: the saved views read valid values again
    engine.backward(loss)
    engine.step()
    torch.manual_seed(0)
    ref = Linears()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    ref(_batch(0)).square().mean().backward()
    opt.step()
    for a, b in zip(_full_values(engine, model), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach())


def test_released_buffer_storage_is_empty_and_regathers_in_place() -> None:
    torch.manual_seed(0)
    model = Linears()
    engine = _engine(model, _config())
    b = engine.parts.buckets[0]
    assert b.state is ParamState.SHARDED and b.storage_bytes() == 0
    before = b._full.untyped_storage()._cdata
    b.gather()
    assert b.storage_bytes() == 4 * b.plan.padded_numel and b._full.untyped_storage()._cdata == before
    b.release()
    assert b.storage_bytes() == 0


CKPT_CASES = [(frozen, reentrant, gas) for frozen in (False, True) for reentrant in (False, True) for gas in (1, 3)]


@pytest.mark.parametrize(("frozen", "reentrant", "gas"), CKPT_CASES,
                         ids=[f"{'frozen' if f else 'trainable'}-{'reentrant' if r else 'nonreentrant'}-gas{g}"
                              for f, r, g in CKPT_CASES])
def test_checkpointing_releases_every_unit_before_the_pass_ends(frozen: bool, reentrant: bool, gas: int) -> None:
    def build() -> nn.Module:
        torch.manual_seed(5)
        return Checkpointed(frozen, reentrant)

    steps, cfg = 2, _config(gas=gas)
    model = build()
    engine = _engine(model, cfg)
    coordinator = engine.parts.coordinator
    held_at_end: list[list[str]] = []
    sweep = coordinator.end_pass

    def spy(record: bool = True) -> None:  # what is still gathered when backward is over, before the sweep
        gathered = [b.name for b in coordinator.buckets if not b.persistent and b.state is not ParamState.SHARDED]
        held_at_end.append(gathered + [f"live:{coordinator.buckets[i].name}" for i in sorted(coordinator.live)])
        sweep(record)

    coordinator.end_pass = spy
    losses = []
    for step in range(steps):
        for k in range(gas):
            loss = engine(_batch(step * gas + k)).square().mean()
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    assert held_at_end == [[]] * (steps * gas), held_at_end
    assert all(count == 0 for count in coordinator.active)
    ref_losses, ref_params = _reference(build, cfg, steps)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses))
    for a, b in zip(_full_values(engine, model), ref_params, strict=True):
        torch.testing.assert_close(a, b)


class Wide(nn.Module):
    """Six equal Linear(32, 32) layers: six buckets when the bucket bound is one layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32, bias=False) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.layers:
            x = torch.tanh(lin(x))
        return x


@pytest.mark.parametrize(("stage", "dtype", "overlap"),
                         [(0, "fp32", False), (1, "bf16", False), (1, "fp32", True), (2, "bf16", True),
                          (3, "fp32", False)])
def test_each_optimizer_call_steps_at_most_one_bucket(stage: int, dtype: str, overlap: bool) -> None:
    torch.manual_seed(0)
    model = Wide()
    cfg = _config(stage=stage, dtype=dtype, optimizer="AdamW")
    cfg["zero_optimization"]["reduce_bucket_size"] = 32 * 32
    engine = _engine(model, cfg)
    masters = engine.parts.masters
    masters = getattr(masters, "inner", masters)
    masters.overlap_gather = overlap  # the CUDA order (each chunk all-gathered while the next steps) on gloo
    bucket_numel = max(m.numel() for m in masters.masters)
    assert len(masters.masters) >= 6
    calls: list[tuple[int, int]] = []

    def count(opt: torch.optim.Optimizer, *_: object) -> None:
        stepped = sum(p.numel() for g in opt.param_groups for p in g["params"])
        with_grad = sum(m.numel() for m in masters.masters if m.grad is not None)
        calls.append((stepped, with_grad))

    handle = engine.optimizer.register_step_pre_hook(count)
    try:
        engine.backward(engine(torch.randn(4, 32).to(engine.precision.compute_dtype)).square().mean())
        engine.step()
    finally:
        handle.remove()
    assert len(calls) >= 2
    assert max(s for s, _ in calls) <= bucket_numel and max(g for _, g in calls) <= bucket_numel, calls
    assert sum(s for s, _ in calls) == sum(m.numel() for m in masters.masters)  # every master stepped once
    assert sum(len(g["params"]) for g in engine.optimizer.param_groups) == len(masters.masters)  # restored
