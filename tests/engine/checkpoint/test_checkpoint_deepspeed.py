"""DeepSpeed 0.19.8 checkpoints load in zerorun and resume on DeepSpeed's own trajectory.

The fixtures (tests/fixtures/ds_checkpoints/, made by tests/fixtures/make_ds_checkpoints.py
with DeepSpeed on 2 gloo ranks) hold, next to each checkpoint, what DeepSpeed got when it
resumed from it: the loss of each of ``STEPS_AFTER`` steps and the fp32 masters after
them. zerorun resumes from the same files at world 2 (as saved) and at world 1 (the
same global batch by two accumulation steps, so the checkpoint is resharded), and must
land on DeepSpeed's numbers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "fixtures"))
from dist_harness import run_distributed  # noqa: E402
from tiny_model import (  # noqa: E402
    GLOBAL_BATCH,
    LR,
    STEPS_AFTER,
    STEPS_BEFORE,
    TinyNet,
    config,
    global_batch,
    parse_case,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ds_checkpoints"
CASES = sorted(d.name for d in FIXTURES.iterdir() if d.is_dir())


def _resume(engine, rank: int, world: int, case: str, gas: int) -> dict:
    """Load fixture ``case`` into ``engine`` and train ``STEPS_AFTER`` steps of the fixture's global batches."""
    import torch.distributed as dist

    from zerorun.engine.checkpoint import consolidate

    compute = torch.bfloat16 if parse_case(case)[1] == "bf16" else torch.float32
    micro = GLOBAL_BATCH // (world * gas)
    _, client = engine.load_checkpoint(str(FIXTURES / case))
    calls_at_load = int(engine.module.calls)
    losses = []
    for step in range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER):
        x, y = global_batch(step, compute)
        total = torch.zeros(())
        for m in range(gas):
            lo = (rank * gas + m) * micro
            loss = torch.nn.functional.mse_loss(engine(x[lo:lo + micro].to(engine.precision.compute_dtype)).float(), y[lo:lo + micro])
            engine.backward(loss)
            engine.step()
            total += loss.detach() / gas
        dist.all_reduce(total)
        losses.append(total.item() / world)
    with tempfile.TemporaryDirectory() as tmp:
        shared = [tmp]
        dist.broadcast_object_list(shared, src=0)
        engine.save_checkpoint(shared[0], tag="resumed")
        params = consolidate(shared[0], "resumed") if rank == 0 else None
        dist.barrier()
    return {"losses": losses, "params": params, "global_steps": engine.global_steps,
            "calls_at_load": calls_at_load, "client": client, "lrs": [g["lr"] for g in engine.optimizer.param_groups]}


def _resume_all(rank: int, world: int, gas: int, runs: list[tuple[str, int]]) -> dict:
    """Every (fixture, zerorun stage) of ``runs`` in one spawned group; a fresh engine from another seed each."""
    import zerorun

    out = {}
    for case, stage in runs:
        torch.manual_seed(1)
        _, dtype, options = parse_case(case)
        cfg = config(stage, dtype, GLOBAL_BATCH // (world * gas), world, **options)
        engine, *_ = zerorun.initialize(model=TinyNet(options["extras"]), config=cfg)
        out[(case, stage)] = _resume(engine, rank, world, case, gas)
    return out


def _expected(case: str) -> dict:
    """DeepSpeed's resume from ``case``; an elastic case resumes as its rigid twin (the same training state)."""
    expected = torch.load(FIXTURES / case / "expected.pt", weights_only=True)
    return _expected(expected["resume_as"]) if "resume_as" in expected else expected


def _check(got: dict, case: str, exact: bool = True) -> None:
    """Within 1e-6 of DeepSpeed's resume; ``exact=False``: bf16 parity tolerances (tests/engine/test_engine_parity.py)."""
    expected = _expected(case)
    loss_tol, rtol, atol = (1e-6, 0.0, 1e-6) if exact else (2**-8, 2**-7, 0.1 * LR * STEPS_AFTER)
    assert got["losses"] == pytest.approx(expected["losses"], abs=1e-6, rel=0 if exact else loss_tol), case
    for name, ref in expected["params"].items():
        torch.testing.assert_close(got["params"][name], ref, atol=atol, rtol=rtol,
                                   msg=lambda m, name=name: f"{case} {name}: {m}")
    assert got["global_steps"] == expected["global_steps"]
    assert got["lrs"] == pytest.approx(expected["lrs"], rel=1e-12)  # the schedule continued where it was
    for name, ref in expected["frozen"].items():  # frozen parameters: DeepSpeed's values, not the fresh model's
        assert torch.equal(got["params"][name], ref), f"{case} {name}"
    if "mix.weight" in expected["params"]:
        assert got["params"]["mix_again.weight"] is got["params"]["mix.weight"]  # the tie survives
    assert got["calls_at_load"] == STEPS_BEFORE  # the buffer came from the checkpoint (a fresh model holds 0)
    assert got["client"]["ds_version"] == "0.19.8"  # DeepSpeed's client state: the keys that are not its own


def test_deepspeed_checkpoints_resume_at_the_world_size_they_were_saved_at() -> None:
    """World 2, the same stage, and stage 1's checkpoint into stage 3 (which DeepSpeed itself cannot load)."""
    runs = [(case, parse_case(case)[0]) for case in CASES] + [("stage1_fp32", 3)]
    got = run_distributed(_resume_all, 2, 1, runs, timeout=300)[0]
    for (case, _), result in got.items():
        _check(result, case)


def test_deepspeed_checkpoints_reshard_into_one_rank() -> None:
    """World 1, two accumulation steps of DeepSpeed's micro-batches: the same global batch, resharded state.

    fp32 stays within 1e-6. bf16 sums the two micro-batch gradients in another order than
    DeepSpeed's 2-rank reduction (bf16 rounding, then amplified by Adam), so it is held to
    the bf16 parity tolerances; its first loss, from the loaded weights alone, is exact.
    """
    runs = [(case, parse_case(case)[0]) for case in CASES]
    got = run_distributed(_resume_all, 1, 2, runs, timeout=300)[0]
    for (case, _), result in got.items():
        _check(result, case, exact=parse_case(case)[1] == "fp32")
        assert abs(result["losses"][0] - _expected(case)["losses"][0]) <= 1e-6, case


def test_a_missing_rank_file_is_named(tmp_path: Path) -> None:
    from zerorun.engine.checkpoint import ds_format
    from zerorun.engine.checkpoint.errors import CheckpointError

    tag = tmp_path / "global_step2"
    shutil.copytree(FIXTURES / "stage2_bf16" / "global_step2", tag)
    (tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"optimizer-states .* rank\(s\) \[1\] is missing"):
        ds_format.read(tag)
    shutil.copytree(FIXTURES / "stage3_fp32" / "global_step2", tmp_path / "s3")
    (tmp_path / "s3" / "zero_pp_rank_0_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"model-states .* rank\(s\) \[0\] is missing"):
        ds_format.read(tmp_path / "s3")
    for r in range(2):  # another save's model-states files: the shapes no longer fit the flat partitions
        name = f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
        shutil.copy(FIXTURES / "stage3_fp32_extras" / "global_step2" / name, tmp_path / "s3" / name)
    with pytest.raises(CheckpointError, match="model-states and optimizer-states files do not match"):
        ds_format.read(tmp_path / "s3")


def test_the_masters_are_deepspeeds_zero_to_fp32_output() -> None:
    """The flat layouts undone: masters, buffers and frozen parameters equal what DeepSpeed's own
    ``get_fp32_state_dict_from_zero_checkpoint`` read from the same files (recorded with each fixture)."""
    from zerorun.engine.checkpoint import ds_format

    for case in CASES:
        stage, _, options = parse_case(case)
        ds = ds_format.read(FIXTURES / case / "global_step2")
        assert ds.stage == stage and ds.world_size == 2
        model = TinyNet(options["extras"])
        trainable = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
        assert {n: tuple(t.shape) for n, t in ds.masters.items()} == trainable, case
        assert set(ds.moments["fc1.weight"]) == {"exp_avg", "exp_avg_sq"}
        assert int(ds.extra["calls"]) == STEPS_BEFORE
        reference = torch.load(FIXTURES / case / "expected.pt", weights_only=True)["zero_to_fp32"]
        for name, want in reference.items():
            got = ds.masters.get(name, ds.extra.get(name))
            if got is None:  # a tied name: DeepSpeed lists it, zerorun keeps it as an alias
                got = ds.masters[ds.aliases[name]]
            assert torch.equal(got.to(want.dtype), want), f"{case} {name}"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_loss_scale_continues_only_on_an_fp16_engine(precision: str) -> None:
    """DeepSpeed fp16 does not run on CPU, so no fixture: DeepSpeed's LossScaler attributes, as its files hold them."""
    import zerorun
    from zerorun.engine.checkpoint.ds_load import _scaler_state

    cfg = {"train_micro_batch_size_per_gpu": 1, precision: {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": LR}}}
    engine, *_ = zerorun.initialize(model=torch.nn.Linear(2, 2), config=cfg)
    saved = {"cur_scale": 1024.0, "cur_iter": 7, "last_overflow_iter": 3, "cur_hysteresis": 1, "dynamic": True}
    got = _scaler_state(saved, engine)
    if precision == "fp16":
        assert got == {"scale": 1024.0, "iteration": 7, "last_overflow_iter": 3, "hysteresis_left": 1}
    else:
        assert got["scale"] == engine.scaler.scale == 1.0
