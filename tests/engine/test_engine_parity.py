"""N-rank ZeRO training (stages 0-2) equals single-process training on the same global batch.

One spawned gloo group per world size runs every sub-case: stage 0/1/2 x fp32/bf16 x
gradient accumulation 1/3 x clipping off/on (overlap_comm alternating), 5 optimizer
steps each, small buckets so parameters spread over several padded buckets. The
reference is computed here, in one process, with the whole global batch.

Tolerances:
* fp32: rtol 1e-5 (only the order of floating-point sums differs).
* bf16: the engine and the reference both compute in bf16 with fp32 master weights,
  but they sum gradients in a different order and granularity (per rank and micro-batch,
  in bf16, vs. one global batch). bf16 keeps 8 significant bits, so each value carries a
  relative rounding error up to 2^-8 = 0.4%. Losses: rtol 2^-8 (one bf16 rounding;
  observed <= 4e-4). Parameters (the module's bf16 copies against the reference's fp32
  masters): rtol 2^-7 for the final bf16 rounding plus atol = 0.1 x lr per step (an AdamW
  update is at most ~lr, SGD's here lr x a gradient of order 1: a 10% disagreement of
  each update is allowed, never a missing or doubled one; observed <= 0.07 x lr x steps).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.dist_harness import assert_matches_reference, run_distributed
from tests.engine.test_engine_cases import STEPS, all_cases, reference, train_case
from zerorun.engine.comm.checks import CHECK_ENV
from zerorun.engine.comm.shm import ENV_SWITCH
from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS

CASES = all_cases()


def _train_all(rank: int, world: int, lane: bool, checks: str) -> dict:
    if not lane:
        os.environ[ENV_SWITCH] = "0"
    os.environ[CHECK_ENV] = checks
    return {case.name: train_case(case, rank, world) for case in CASES}


SHM, P2P = "shared memory between the ranks of this host", "point-to-point chunk exchange (gloo has no native reduce-scatter)"


# world 2 reduces through the same-host shared-memory lane, world 4 through gloo's
# point-to-point exchanges (the path of ranks on different hosts); "nccl-deferred" runs the
# NCCL policy on gloo (native reduce-scatter / all-gather, configured bucket sizes) with every
# asynchronous collective's buffer poisoned until its wait() and every tensor's device checked
@pytest.fixture(scope="module", params=[(2, True, "", SHM), (4, False, "", P2P), (2, True, "native,deferred,device", "")],
                ids=["world2-shared-memory", "world4-gloo", "world2-nccl-policy-deferred"])
def runs(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    world, lane, checks, via = request.param
    results = run_distributed(_train_all, world, lane, checks, timeout=240)
    assert {r[name]["via"] for r in results for name in r} == {via}
    return world, results


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_parity_with_single_process(runs: tuple[int, list[dict]], case) -> None:
    world, results = runs
    ref_losses, ref_params = reference(case, world)
    per_rank = [r[case.name] for r in results]
    assert_matches_reference(case, world, per_rank, STEPS, ref_losses, ref_params)
    # every rank ends with the same (compute) parameters
    for r in per_rank[1:]:
        for a, b in zip(r["params"], per_rank[0]["params"], strict=True):
            assert torch.equal(a, b)


def _padding_bound(world: int, buckets: int, params: int) -> int:
    """Slots start ALIGN_ELEMENTS-aligned and buckets end on a multiple of world x ALIGN_ELEMENTS."""
    return ALIGN_ELEMENTS * (params + world * buckets)


def _case(stage: int, dtype: str) -> str:
    """The gas-1, no-clip AdamW sub-case of a stage and dtype (its name)."""
    return next(c.name for c in CASES if c.stage == stage and c.dtype == dtype and c.gas == 1 and c.clip == 0)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_memory_breakdown_matches_zero_arithmetic(runs: tuple[int, list[dict]], stage: int) -> None:
    """bf16 + Adam: 2 bytes/param of compute copy; master 4 and moments 8 bytes per *owned* param.

    Owned = all of them at stage 0, a 1/N chunk at stages 1-2 (so master + state = 12 Psi/N).
    Stage 2 keeps no full gradient: only the fp32 accumulation shard (4 Psi/N) - it holds no
    separate 16-bit gradient shard (the reduce-scatter output is read from the staging
    buffer, counted under ``buffers``). ``padded`` is Psi plus the per-bucket padding to a
    multiple of N, which the assertions below bound.
    """
    world, results = runs
    for rank, r in enumerate(results):
        res = r[_case(stage, "bf16")]
        mem, psi, padded, n_buckets = res["memory"], res["numel"], res["padded"], res["buckets"]
        assert psi <= padded < psi + _padding_bound(world, n_buckets, len(res["params"]))
        owned = padded if stage == 0 else padded // world
        assert mem["params"] == 2 * padded, (rank, mem)
        assert mem["master_params"] == 4 * owned, (rank, mem)
        step_counters = 4 * n_buckets  # AdamW's per-tensor fp32 `step`
        assert mem["optimizer_states"] == 8 * owned + step_counters, (rank, mem)
        if stage < 2:
            assert mem["gradients"] == 2 * padded and mem["buffers"] == 0, (rank, mem)
        else:
            assert mem["gradients"] == 4 * padded // world, (rank, mem)
            staging = 2 * res["max_bucket"]  # one bf16 staging bucket (two with overlap_comm)
            assert mem["buffers"] in (staging, 2 * staging), (rank, mem, staging)
        # fp32: the master is the parameter buffer itself
        fp32 = r[_case(stage, "fp32")]["memory"]
        assert fp32["master_params"] == 0 and fp32["params"] == 4 * padded


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_comm_volume_is_two_psi_per_step(runs: tuple[int, list[dict]], stage: int) -> None:
    """Per optimizer step each rank moves 2 Psi elements (an all-reduce counts as RS + AG),
    plus at most one scalar all-reduce (the global gradient norm) at stages 1-2."""
    world, results = runs
    for r in results:
        res = r[_case(stage, "fp32")]
        padded = res["padded"]
        for per_step in res["comm_per_step"]:
            total = 2 * per_step["all_reduce"] + per_step["reduce_scatter"] + per_step["all_gather"]
            control = 0 if stage == 0 else 2  # the norm's one-element all-reduce, counted twice
            assert total == 2 * padded + control, per_step
            assert padded - res["numel"] < _padding_bound(world, res["buckets"], len(res["params"]))
            if stage > 0:
                assert per_step["reduce_scatter"] == padded and per_step["all_gather"] == padded
