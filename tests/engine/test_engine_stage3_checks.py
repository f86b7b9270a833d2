"""zero.Init, GatheredParameters, the memory window and save_16bit_model, run on every spawned rank (no tests here)."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist

from tests.engine.test_engine_stage3_cases import (
    MICRO_BATCH,
    STEPS,
    Case,
    global_batch,
    loss_fn,
    make_model,
    rank_rows,
    reference,
    train_case,
)


def _init_checks(rank: int, world: int) -> dict:
    import zerorun
    from zerorun.engine.mechanism.partition import bucket_of

    case = Case("gpt", "fp32", 1, False, False)
    with zerorun.zero.Init(config=case.config()):
        model = make_model("gpt")
    ref = make_model("gpt")
    sharded = all(p.numel() == 0 and bucket_of(p) is not None for p in model.parameters())
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        equal = all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    trained = train_case(case, rank, world, model=model)["params"]
    plain = train_case(case, rank, world)["params"]
    stage2 = dict(case.config(), zero_optimization={"stage": 2})
    with zerorun.zero.Init(config=stage2):
        whole = make_model("gpt")
    return {"init_sharded": sharded, "init_equal": equal,
            "init_train_equal": all(torch.equal(a, b) for a, b in zip(trained, plain, strict=True)),
            "init_disabled_whole": all(p.numel() > 0 and bucket_of(p) is None for p in whole.parameters())}


def _gathered_checks(rank: int) -> dict:
    import zerorun
    from zerorun.engine.mechanism.partition import bucket_of

    model = make_model("mlp")
    zerorun.initialize(model=model, config=Case("mlp", "bf16", 1, False, False).config())
    w = model.head.weight
    with zerorun.zero.GatheredParameters(w, modifier_rank=0), torch.no_grad():
        w.fill_(1.0 if rank == 0 else 2.0)  # only rank 0's edit may land
    with zerorun.zero.GatheredParameters([w]):
        everywhere = bool((w == 1.0).all())
    b = bucket_of(w)
    follows = b.master is not None and torch.equal(b.master, b.local.float())
    fc1 = model.fc1.weight
    with zerorun.zero.GatheredParameters([fc1]):
        before = fc1.detach().clone()
        with torch.no_grad():
            fc1.add_(1.0)  # no modifier_rank: discarded
    with zerorun.zero.GatheredParameters([fc1]):
        unchanged = torch.equal(fc1, before)
    m2 = make_model("mlp")
    engine2, *_ = zerorun.initialize(model=m2, config=dict(Case("mlp", "fp32", 1, False, False).config(),
                                                           zero_optimization={"stage": 2}))
    calls = sum(v["calls"] for v in engine2.comm_stats().values())
    with zerorun.zero.GatheredParameters(list(m2.parameters()), modifier_rank=0):
        pass
    return {"modified_everywhere": everywhere, "master_follows": follows, "read_only_unchanged": unchanged,
            "stage2_noop_comm": sum(v["calls"] for v in engine2.comm_stats().values()) - calls}


def _memory_checks(rank: int, world: int) -> dict:
    import zerorun
    from zerorun.engine.mechanism.partition import PartitionedBucket

    case = Case("deep", "fp32", 1, True, False)
    cfg = case.config()
    cfg["zero_optimization"].update(stage3_prefetch_bucket_size=1100, stage3_max_live_parameters=2200,
                                    stage3_max_reuse_distance=0)
    model = make_model("deep")
    engine, *_ = zerorun.initialize(model=model, config=cfg)
    buckets: list[PartitionedBucket] = engine.parts.buckets
    peak = [0]

    def sample() -> None:  # the full buffers actually allocated right now
        peak[0] = max(peak[0], sum(b.data.numel() for b in buckets))

    for b in buckets:
        for meth in ("gather_async", "wait"):
            orig = getattr(b, meth)
            setattr(b, meth, lambda orig=orig: (orig(), sample()))
    for step in range(STEPS):
        x, y = global_batch("deep", step, MICRO_BATCH * world)
        sl = rank_rows(0, rank, world)
        engine.backward(loss_fn("deep", engine(x[sl].to(engine.precision.compute_dtype)), y[sl]))
        engine.step()
    measured = peak[0]  # before the read-back below gathers everything on purpose
    _, ref_params = reference(case, world)
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        match = all(torch.allclose(p, q, rtol=1e-5, atol=1e-6)
                    for p, q in zip(model.parameters(), ref_params, strict=True))
    return {"peak_measured": measured, "peak_counted": engine.parts.coordinator.stats.peak_live_numel,
            "max_live": 2200, "unit": max(b.plan.padded_numel for b in buckets),
            "total": sum(b.plan.padded_numel for b in buckets), "losses_match": match}


def _save_checks(rank: int, world: int) -> dict:
    import zerorun
    from zerorun.engine.errors import EngineError

    model = make_model("gpt")
    engine, *_ = zerorun.initialize(model=model, config=Case("gpt", "bf16", 1, True, False).config())
    out_dir = os.path.join(tempfile.gettempdir(), f"zr-stage3-save-{os.getppid()}")
    engine.save_16bit_model(out_dir, "model.bin")
    dist.barrier()
    result: dict = {}
    with zerorun.zero.GatheredParameters(list(model.parameters())):  # every rank takes part
        live = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if rank == 0:
        saved = torch.load(os.path.join(out_dir, "model.bin"))
        expected_keys = set(make_model("gpt").state_dict())
        result["saved_keys_ok"] = set(saved) == expected_keys
        result["saved_equal"] = all(saved[k].dtype == torch.bfloat16 and torch.equal(saved[k], live[k])
                                    for k in expected_keys if "weight" in k or "bias" in k)
    dist.barrier()
    if rank == 0:
        os.remove(os.path.join(out_dir, "model.bin"))
    cfg = Case("mlp", "fp32", 1, False, False).config()
    cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    engine2, *_ = zerorun.initialize(model=make_model("mlp"), config=cfg)
    try:
        engine2.save_16bit_model(out_dir, "never.bin")
        result["save_refused"] = False
    except EngineError:
        result["save_refused"] = True
    return result


def run_checks(rank: int, world: int) -> dict:
    out = _init_checks(rank, world)
    out.update(_gathered_checks(rank))
    out["memory"] = _memory_checks(rank, world)
    out.update(_save_checks(rank, world))
    return out
