"""``deepspeed.utils.safe_get_full_*`` / ``safe_set_*`` and stage-3 leaf modules, at world 2 on gloo.

Every stage against one single-process reference (same initial weights, the whole global
batch, the same AdamW): the full gradient after backward, the fp32 master and Adam's
``exp_avg`` after each step; the ranks' local fragments concatenate to the full value;
a full set reads back on every rank and the next step starts from it. The model's
first weight (63 elements of a 94-element bucket, laid out with 16-byte alignment) straddles the two ranks' chunks.
"""

from __future__ import annotations

import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed
from zerorun.compat import utils as ds_utils

STEPS = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(9, 7), nn.Tanh(), nn.Linear(7, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 9, generator=g), torch.randn(8, 3, generator=g)


def _config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.0}}}


def _reference() -> dict[str, list]:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.0)
    x, y = _data()
    out: dict[str, list] = {"grads": [], "params": [], "exp_avg": []}
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        out["grads"].append([p.grad.clone() for p in model.parameters()])
        opt.step()
        out["params"].append([p.detach().clone() for p in model.parameters()])
        out["exp_avg"].append([opt.state[p]["exp_avg"].clone() for p in model.parameters()])
    return out


def _rank(rank: int, world: int, stages: list[int]) -> dict[int, dict]:
    results = {}
    x, y = _data()
    x, y = x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]
    for stage in stages:
        model = _model()
        engine, *_ = zerorun.initialize(model=model, config=_config(stage))
        params = list(model.parameters())
        out: dict[str, list] = {"grads": [], "params": [], "exp_avg": []}
        for _ in range(STEPS):
            engine.backward(nn.functional.mse_loss(engine(x), y))
            out["grads"].append([ds_utils.safe_get_full_grad(p) for p in params])
            engine.step()
            out["params"].append([ds_utils.safe_get_full_fp32_param(p) for p in params])
            out["exp_avg"].append([ds_utils.safe_get_full_optimizer_state(p, "exp_avg") for p in params])
        out["local"] = [ds_utils.safe_get_local_fp32_param(p).clone() for p in params]
        out["local_exp_avg"] = [ds_utils.safe_get_local_optimizer_state(p, "exp_avg").clone() for p in params]
        target = [torch.full_like(p, 0.5, dtype=torch.float32) * (i + 1) for i, p in enumerate(params)]
        for p, t in zip(params, target, strict=True):
            ds_utils.safe_set_full_fp32_param(p, t)
            ds_utils.safe_set_full_optimizer_state(p, torch.zeros_like(t), "exp_avg")
        out["after_set"] = [ds_utils.safe_get_full_fp32_param(p) for p in params]
        out["exp_avg_after_set"] = [ds_utils.safe_get_full_optimizer_state(p, "exp_avg") for p in params]
        out["foreign"] = ds_utils.safe_get_full_fp32_param(nn.Parameter(torch.ones(2)))
        engine.destroy()
        results[stage] = out
    results["leaf"] = _leaf_run(x, y)
    return results


def _leaf_run(x: torch.Tensor, y: torch.Tensor) -> dict:
    """Stage 3 with the first block flagged a leaf: one unit for its subtree, the same training."""
    torch.manual_seed(0)  # the same parameters, in the same order, as _model()
    model = nn.Sequential(nn.Sequential(nn.Linear(9, 7), nn.Tanh()), nn.Linear(7, 3))
    flagged, missing = ds_utils.set_z3_leaf_modules_by_name(model, ["0"])
    engine, *_ = zerorun.initialize(model=model, config=_config(3))
    for _ in range(STEPS):
        engine.backward(nn.functional.mse_loss(engine(x), y))
        engine.step()
    units = [(u.name, len(u.buckets)) for u in engine.parts.units]
    params = [ds_utils.safe_get_full_fp32_param(p) for p in model.parameters()]
    leaves = [m is model[0] for m in ds_utils.get_z3_leaf_modules(model)]
    engine.destroy()
    return {"units": units, "params": params, "leaves": leaves, "missing": missing,
            "flagged": [m is model[0] for m in flagged]}


def test_full_and_local_accessors_match_the_reference_at_every_stage() -> None:
    ref = _reference()
    stages = [0, 1, 2, 3]
    per_rank = run_distributed(_rank, 2, stages, timeout=240)
    for stage in stages:
        for rank, got in enumerate(r[stage] for r in per_rank):
            where = f"stage {stage} rank {rank}"
            for key in ("grads", "params", "exp_avg"):
                for step in range(STEPS):
                    for i, (g, want) in enumerate(zip(got[key][step], ref[key][step], strict=True)):
                        assert g.dtype == torch.float32 and g.shape == want.shape, (where, key, i)
                        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6, msg=f"{where} {key} {step} {i}")
            for i, p in enumerate(ref["params"][-1]):
                torch.testing.assert_close(got["after_set"][i], torch.full_like(p, 0.5) * (i + 1))
                assert got["exp_avg_after_set"][i].abs().max() == 0
            assert got["foreign"] is None
        sharded = stage > 0
        for i, want in enumerate(ref["params"][-1]):
            locals_ = [r[stage]["local"][i] for r in per_rank]
            if sharded:  # the chunks are contiguous and in rank order: the fragments tile the parameter
                torch.testing.assert_close(torch.cat(locals_), want.reshape(-1), rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(torch.cat([r[stage]["local_exp_avg"][i] for r in per_rank]),
                                           ref["exp_avg"][-1][i].reshape(-1), rtol=1e-5, atol=1e-6)
            else:
                for frag in locals_:
                    torch.testing.assert_close(frag, want.reshape(-1), rtol=1e-5, atol=1e-6)
    straddles = [r[1]["local"][0].numel() for r in per_rank]
    assert all(0 < n < 63 for n in straddles) and sum(straddles) == 63  # the case the test is built for
    for got in (r["leaf"] for r in per_rank):
        assert got["leaves"] == got["flagged"] == [True] and got["missing"] == []
        assert [name for name, _ in got["units"]] == ["<root>", "0", "1"]  # no unit for "0.0" inside the leaf
        assert dict(got["units"])["0"] == 1  # the leaf's Linear is in the leaf's own bucket
        for g, want in zip(got["params"], ref["params"][-1], strict=True):
            torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)


def _batch_and_cache(rank: int, world: int) -> dict:
    x, y = _data()
    model = _model()
    cfg = {**_config(3), "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = zerorun.initialize(model=model, config=cfg)
    out: dict = {}
    try:
        engine.set_train_batch_size(6)
    except ValueError as e:
        out["error"] = str(e)
    engine.set_train_batch_size(16)  # 2 micro-steps of 4 per rank
    out["gas"] = engine.gradient_accumulation_steps(), engine.train_batch_size()
    for micro in range(2):
        rows = slice((rank * 2 + micro) * 2, (rank * 2 + micro + 1) * 2)  # the global batch of 8, in quarters
        engine.backward(nn.functional.mse_loss(engine(x[rows]), y[rows]))
        engine.step()
    out["steps"] = engine.global_steps
    out["params"] = [ds_utils.safe_get_full_fp32_param(p) for p in model.parameters()]
    with torch.no_grad():
        engine(x[:2])  # gathers units; the forward releases most, the cache call releases the rest
    out["live_before_empty"] = sorted(engine.parts.coordinator.live)
    engine.empty_partition_cache()
    out["live_after_empty"] = sorted(engine.parts.coordinator.live)
    engine.destroy()
    return out


def test_set_train_batch_size_changes_accumulation_and_empty_partition_cache_releases() -> None:
    """A batch of 16 over 2 ranks of micro-batch 4 is 2 accumulation steps: one optimizer step over all 8
    rows (each micro-batch of 2 rows counts 1/4), as the reference's one full-batch step."""
    ref = _reference()
    per_rank = run_distributed(_batch_and_cache, 2, timeout=240)
    for got in per_rank:
        assert "multiple of train_micro_batch_size_per_gpu (4) x data-parallel world size (2) = 8" in got["error"]
        assert got["gas"] == (2, 16) and got["steps"] == 1 and got["live_after_empty"] == []
        assert got["live_before_empty"], "nothing was gathered: the case would not test the release"
        for g, want in zip(got["params"], ref["params"][0], strict=True):
            torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)


def test_local_accessors_give_none_for_a_frozen_parameter(world_of_one: None) -> None:
    """DeepSpeed's local getters give None for a frozen parameter of the engine's model and its setters do
    nothing (its tensor-fragment tests freeze the first layer); a parameter of no engine's model is an error."""
    import pytest

    from zerorun.engine.errors import EngineError

    model = _model()
    model[0].requires_grad_(False)
    engine, *_ = zerorun.initialize(model=model, config=_config(3))
    frozen, trained = model[0].weight, model[2].weight
    assert ds_utils.safe_get_local_fp32_param(frozen) is None
    assert ds_utils.safe_get_local_optimizer_state(frozen, "exp_avg") is None
    assert ds_utils.safe_get_local_grad(frozen) is None
    ds_utils.safe_set_local_fp32_param(frozen, torch.zeros(1))  # nothing to set
    assert ds_utils.safe_get_local_fp32_param(trained) is not None
    with pytest.raises(EngineError, match="not trained by an engine"):
        ds_utils.safe_get_local_fp32_param(nn.Parameter(torch.ones(2)))
    engine.destroy()
