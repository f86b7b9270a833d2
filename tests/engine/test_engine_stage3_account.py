"""Which buffers a stage-3 rank holds at its training-step peak, by owner (zerorun.simulate.account).

* On a simulated world of 8 (meta, torch's fake group, whose reductions are never over until
  waited for), the gradient staging pool never holds more buffers than its bound, when large
  units' own reduce-scatters and small units' coalesced groups interleave in backward. Before,
  waiting for the oldest reduction returned no buffer when that reduction was a coalesced
  group, and the pool grew by one buffer of the largest unit each time (GPT-2 124M at world 8
  with both offloads: 21 buffers, 1.62 GB on the device against the estimate's 0.48).
* On two real gloo ranks (the shared-memory lane on), at the peak: nothing is held for ZeRO++
  when its keys are off, the staging pool is within its bound, the lane maps its segments
  and no more, and every storage the engine reaches has an owner; and the account matches
  the engine's own figures (parameter shards, gradient sums, optimizer state).
"""

from __future__ import annotations

import torch
from torch import nn

from tests.dist_harness import run_distributed
from zerorun.simulate.account import OWNERS, step_account

HIDDEN = 64
ZEROPP = {owner for owner, _ in OWNERS if owner.startswith("ZeRO++")}


class Mixed(nn.Module):
    """Large units (one reduce-scatter each) between small ones (coalesced into groups)."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"up": nn.Linear(HIDDEN, 4 * HIDDEN), "norm": nn.LayerNorm(4 * HIDDEN),
                           "down": nn.Linear(4 * HIDDEN, HIDDEN), "gate": nn.Linear(HIDDEN, 32)})
            for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            h = b["down"](torch.relu(b["norm"](b["up"](x))))
            x = x + h + b["gate"](h).mean(dim=-1, keepdim=True)
        return x


def _config(**zero: object) -> dict:
    # reduce_bucket_size 4096: units under 4096 elements are coalesced, the Linear(64, 256)s are not
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "steps_per_print": 10**9,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 3, "reduce_bucket_size": 4096, "stage3_param_persistence_threshold": 0,
                                  **zero}}


def _watched_step(engine: object, model: nn.Module, x: torch.Tensor, every: int = 3) -> object:
    def forward_backward() -> None:
        engine.backward(engine(x).square().mean())  # type: ignore[operator,attr-defined]

    return step_account(engine, model, forward_backward, engine.step, every=every)  # type: ignore[attr-defined]


def test_the_staging_pool_stays_within_its_bound_when_groups_and_units_interleave() -> None:
    import zerorun
    from zerorun.simulate import world

    with world(8, rank=3, device="meta"):
        with torch.device("meta"):
            torch.manual_seed(0)
            model = Mixed()
        engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=_config())
        sync = engine.parts.grad_sync
        x = torch.zeros(2, HIDDEN, device="meta")
        most = 0
        for _ in range(2):
            watch = _watched_step(engine, model, x)
            most = max(most, watch.peak.count("staging pool"))
        assert sync.limit == 2
        assert sync.allocated <= sync.limit, (sync.allocated, sync.extra_allocated)
        assert 1 <= most <= sync.limit


def _real(rank: int, world_size: int) -> dict:
    import zerorun

    torch.manual_seed(0)
    model = Mixed()
    engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=_config())
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(x).square().mean())
    engine.step()
    watch = _watched_step(engine, model, x, every=8)  # and at every gradient: backward's peak
    peak = watch.peak
    lane = engine.coll.lane
    sync = engine.parts.grad_sync
    mem = engine.memory_breakdown()
    return {"owners": peak.by_owner(resident=False), "counts": {o: peak.count(o) for o in peak.by_owner()},
            "other": [h.path for h in peak.held if h.owner == "other" and h.nbytes > 0],
            "lane_segments": len(lane.segments) if lane is not None else 0, "limit": sync.limit,
            "allocated": sync.allocated, "grad_bytes": mem["gradients"], "state_bytes": mem["optimizer_states"],
            "shard_bytes": sum(b.local.numel() * b.local.element_size() for b in engine.parts.buckets)}


def test_at_the_peak_every_storage_has_an_owner_and_nothing_is_held_for_what_is_off() -> None:
    for r in run_distributed(_real, 2):
        owners, counts = r["owners"], r["counts"]
        assert not ZEROPP & set(owners), owners  # ZeRO++'s keys are off: no secondary shard, no int8 shard
        assert counts.get("staging pool", 0) <= r["limit"] and r["allocated"] <= r["limit"], r
        assert counts.get("lane slots", 0) == r["lane_segments"] in (0, 2), r  # this rank's segment and its peer's
        assert r["other"] == [], r["other"]  # every storage with bytes is filed under an owner
        assert owners["gradient sums"] == r["grad_bytes"]
        assert owners["optimizer state"] == r["state_bytes"]
        assert owners["parameter shards"] == r["shard_bytes"]
