"""Resume and reshard: 6 steps straight == 3 steps, save, fresh processes, load, 3 steps.

Three spawned gloo groups, in order, sharing one checkpoint directory:

1. world 2 - for each case (stage 0, 1, 2, 3 in fp32 and stage 2 in fp16 with dynamic loss
   scaling, all with a WarmupLR schedule): a straight run of 6 steps that saves
   with ``save_checkpoint`` after step 3;
2. world 4 - each world-2 checkpoint loaded (same stage, and the next stage) into a
   model with other initial weights, then 3 more steps and a save;
3. world 2, fresh processes - each world-2 checkpoint resumed for 3 steps, which must be
   bit-identical to the straight run (same world size, same reduction order); and each
   world-4 checkpoint loaded back.

Right after a load the parameters equal the saved ones exactly (at any world size and
stage: the load copies fp32 masters). Training continued at world 4 sums gradients in
another order, so it matches the straight run within fp32 rounding (rtol 1e-5) and
fp16 rounding (rtol 2^-10 on the fp16 compute copy, one ulp).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.checkpoint.test_checkpoint_cases import CASES, reshard_phase, resume_phase, save_phase

NAMES = [c.name for c in CASES]


@pytest.fixture(scope="module")
def phases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("ckpt"))
    saved = run_distributed(save_phase, 2, root, timeout=240)
    resharded = run_distributed(reshard_phase, 4, root, timeout=240)
    resumed = run_distributed(resume_phase, 2, root, timeout=240)
    return {"root": root, "saved": saved, "resharded": resharded, "resumed": resumed}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), f"{what}: {n} differs (max |diff| {(a[n] - b[n]).abs().max():.3g})"


@pytest.mark.parametrize("name", NAMES)
def test_resume_is_bit_identical(phases: dict[str, Any], name: str) -> None:
    for rank in range(2):
        straight = phases["saved"][rank][name]["straight"]
        resumed = phases["resumed"][rank][name]
        _equal(resumed["end"]["params"], straight["params"], f"[rank {rank}] {name} resumed vs straight")
        assert resumed["end"]["loss_scale"] == straight["loss_scale"]
        assert resumed["end"]["scaler"] == straight["scaler"]
        assert resumed["end"]["lr"] == straight["lr"]
        assert resumed["end"]["global_steps"] == straight["global_steps"] == 6
        assert resumed["end"]["skipped"] == straight["skipped"]
        assert resumed["client"] == {"case": name, "rank": rank}
        assert Path(resumed["path"]).name == "global_step3"
        # the RNG streams continue where the saving run left them
        assert torch.equal(resumed["rng_after_load"], phases["saved"][rank][name]["rng_after_save"])


def test_fp16_case_changed_its_loss_scale(phases: dict[str, Any]) -> None:
    """The scaler state is only tested if it moves: with window 2 it doubles during the run."""
    s = phases["saved"][0]["stage2-fp16"]
    assert s["half"]["loss_scale"] != s["straight"]["loss_scale"] or s["straight"]["skipped"] > 0
    assert s["half"]["loss_scale"] != 16.0


@pytest.mark.parametrize("name", NAMES)
def test_load_at_world_4_and_other_stage(phases: dict[str, Any], name: str) -> None:
    half = phases["saved"][0][name]["half"]
    for rank in range(4):
        r = phases["resharded"][rank][name]
        for stage, snap in r["loaded"].items():
            _equal(snap["params"], half["params"], f"[rank {rank}] {name} loaded at world 4, stage {stage}")
            assert snap["loss_scale"] == half["loss_scale"] and snap["lr"] == half["lr"]
            assert snap["global_steps"] == 3
            assert snap["client"]["rank"] == rank % 2
        straight = phases["saved"][0][name]["straight"]["params"]
        rtol = 1e-5 if "fp32" in name else 2**-10
        for n, p in r["end"]["params"].items():
            torch.testing.assert_close(p, straight[n], rtol=rtol, atol=1e-6 if "fp32" in name else 1e-3,
                                       msg=lambda m, n=n, rank=rank: f"[rank {rank}] {name} continued at world 4: {n}: {m}")


@pytest.mark.parametrize("name", NAMES)
def test_load_world_4_checkpoint_at_world_2(phases: dict[str, Any], name: str) -> None:
    for rank in range(2):
        _equal(phases["resumed"][rank][name]["from_w4"]["params"], phases["resharded"][0][name]["end"]["params"],
               f"[rank {rank}] {name} saved at world 4, loaded at world 2")


@pytest.mark.parametrize("name", NAMES)
def test_consolidated_state_dict_equals_engine_parameters(phases: dict[str, Any], name: str) -> None:
    from zerorun.engine.checkpoint import consolidate

    state = consolidate(Path(phases["root"]) / name)
    half = phases["saved"][0][name]["half"]["params"]
    if "fp16" in name:  # the module holds fp16 copies of the fp32 masters the checkpoint stores
        state = {n: t.half().float() for n, t in state.items()}
    _equal(state, half, f"{name} consolidated vs the engine's parameters")
