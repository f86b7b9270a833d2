"""The in-flight terms of a step and a stage's physical floor: the arithmetic, term by term.

The model is issue 19's: 12 blocks of Linear(1024, 4096) + Linear(4096, 1024) and a
Linear(1024, 1024) head, fp32, AdamW, world 2; its floors are the issue's table.
"""

from __future__ import annotations

import pytest

from zerorun.estimate import (
    Buckets,
    Dtype,
    EstimateRequest,
    ModelShape,
    Optimizer,
    Placement,
    Training,
    estimate_row,
)
from zerorun.estimate.buffers import MAX_BUCKET_NUMEL
from zerorun.estimate.floor import frozen_bytes, physical_floor
from zerorun.estimate.in_flight import StepSizes, in_flight, optimizer_temporaries

MiB = 2**20
H = 1024
UNIT = (H * 4 * H + 4 * H) + (4 * H * H + H)  # one block: 8,393,728
PSI = 12 * UNIT + H * H + H  # 101,774,336
LARGEST_PARAM = 4 * H * H
FP32 = Training(PSI, 2, Dtype.FP32, Optimizer.ADAMW)


def test_the_floors_of_the_issue_table() -> None:
    floors = {s: physical_floor(FP32, s, unit=UNIT, bucket=LARGEST_PARAM) for s in range(4)}
    p, shard = 4 * PSI, 4 * PSI // 2
    assert floors[0].total == 4 * p + 4 * UNIT  # DDP: param, grad, two moments, and one unit's gradients
    assert floors[1].total == 2 * p + 2 * shard + 4 * UNIT
    assert floors[2].total == p + shard + 2 * shard + 4 * LARGEST_PARAM + 4 * UNIT  # one staging bucket
    assert floors[3].total == 4 * shard + 3 * 4 * UNIT  # 16P/N + two gathered units + one unit's gradients
    assert round(floors[1].total / MiB) == 1197 and round(floors[3].total / MiB) == 873  # issue 19's table
    assert floors[3].total / floors[0].total == pytest.approx(0.55, abs=0.01)
    # the step's temporaries (one bucket's shard) never exceed backward's unit: they do not add
    assert floors[1].in_flight.step["optimizer_temporaries"] == 4 * LARGEST_PARAM // 2 < 4 * UNIT


def test_overlap_comm_doubles_stage_2_staging_and_nothing_else() -> None:
    plain = physical_floor(FP32, 2, unit=UNIT, bucket=LARGEST_PARAM)
    overlap = physical_floor(FP32, 2, unit=UNIT, bucket=LARGEST_PARAM, overlap_comm=True)
    assert overlap.total - plain.total == 4 * LARGEST_PARAM
    assert physical_floor(FP32, 1, unit=UNIT, bucket=1, overlap_comm=True).in_flight.held == {}


def test_frozen_bases_hold_only_their_compute_copy() -> None:
    lora = Training(10_000, 4, Dtype.BF16, Optimizer.ADAMW)
    assert frozen_bytes(lora, 3, 1001) == 251 * 2 and frozen_bytes(lora, 1, 1001) == 1001 * 2
    floor = physical_floor(lora, 3, unit=100, gathered_unit=2100, bucket=0, frozen_params=1001)
    assert floor.terms()["gathered_params"] == 2 * 2100 * 2  # the gathered unit carries its frozen base
    assert floor.terms()["unit_gradients"] == 100 * 2  # gradients only for what trains
    assert floor.total == floor.model_states + 251 * 2 + 2 * 2100 * 2 + 100 * 2


def test_the_step_phase_and_backward_never_add_up() -> None:
    t = Training(1000, 2, Dtype.FP32, Optimizer.ADAMW)
    big_step = in_flight(t, Placement(1), StepSizes(unit=10, bucket=1000))
    assert big_step.step == {"optimizer_temporaries": 4 * 500}  # the rank's shard of the bucket
    assert big_step.peak == 4 * 500  # more than the unit's 40 bytes: the step phase sets the peak
    small_step = in_flight(t, Placement(2), StepSizes(unit=400, bucket=100, staging_buffers=2))
    assert small_step.peak == 2 * 100 * 4 + 400 * 4  # staging held throughout, then the unit's gradients
    assert in_flight(t, Placement(0), StepSizes(unit=1, bucket=1000)).step["optimizer_temporaries"] == 4000


def test_optimizer_temporaries_follow_torch_adamw() -> None:
    assert optimizer_temporaries(Optimizer.ADAMW, 100) == 400  # foreach: one fp32 sqrt(v) per element
    assert optimizer_temporaries(Optimizer.ADAM, 100, foreach=False) == 800  # loop: sqrt(v) and its quotient
    assert optimizer_temporaries(Optimizer.SGD, 100) == 0
    from zerorun.estimate import Offload

    offloaded = in_flight(FP32, Placement(1, Offload.CPU), StepSizes(unit=UNIT, bucket=UNIT))
    assert offloaded.step["optimizer_temporaries"] == 0  # the step runs on the host


def test_the_estimate_counts_the_in_flight_terms_once() -> None:
    shape = ModelShape(hidden=1024, layers=4, heads=16, vocab=32000)
    training = Training(shape.param_count(), 4)
    # the gloo layout (capped at 2^21 elements), where a bucket is the largest parameter's
    request = EstimateRequest(training, gpus_per_node=4, shape=shape, overhead=0,
                              buckets=Buckets(layout_cap=MAX_BUCKET_NUMEL))
    unit = shape.largest_unit()
    bucket = max(shape.embedding_params(), 1024 * shape.ffn_size)  # stages 0-2: the largest parameter's bucket
    for stage in (0, 1):
        row = estimate_row(request, Placement(stage))
        shard = bucket if stage == 0 else -(-bucket // 4)
        assert row.gpu["buffers"] == 0 and row.gpu["in_flight"] == max(unit * 2, 4 * shard)
    stage3 = estimate_row(request, Placement(3))
    detail = stage3.buffer_detail  # stage 3's backward transients are in buffers already
    assert detail["unit_gradients"] == unit * 2 and stage3.gpu["in_flight"] == 0


def test_the_bucket_cap_mirrors_the_engine() -> None:
    from zerorun.engine.mechanism.buckets import MAX_BUCKET_NUMEL as ENGINE_CAP

    assert MAX_BUCKET_NUMEL == ENGINE_CAP
    assert Buckets().reduce_bucket_size > MAX_BUCKET_NUMEL  # so on gloo the cap is what the default layout uses


def _facts(stage: int, per_rank: list[dict[str, int]]) -> dict:
    return {"stage": stage, "world_size": 2, "num_parameters": PSI, "dtype": "fp32", "optimizer": "adamw",
            "largest_bucket": UNIT // 2, "largest_param": LARGEST_PARAM, "physical_per_rank": per_rank,
            "memory_breakdown": {"params": 1}}


def test_measure_takes_the_worse_rank_and_the_device_peak_first() -> None:
    from zerorun.estimate.measure import against_ddp, compare

    host = [{"host_peak_rss": 900 * MiB, "host_baseline_rss": 200 * MiB, "host_rss": 0},
            {"host_peak_rss": 1000 * MiB, "host_baseline_rss": 200 * MiB, "host_rss": 0}]
    rows, physical, _ = compare(_facts(3, host))
    assert physical.per_rank == [700 * MiB, 800 * MiB] and physical.worst_rank == 1
    assert physical.estimated == rows[-1].estimated and physical.ratio == 800 * MiB / rows[-1].estimated
    flight = next(r for r in rows if r.term == "in_flight").estimated
    unit = UNIT // 2  # stage 3: the unit's gradients, and the unit plus the default 5e7-element prefetch gathered
    assert flight == 4 * (unit + unit + 50_000_000)
    gpu = [{**host[0], "device_peak_allocated": 5 * MiB}, {**host[1], "device_peak_allocated": 6 * MiB}]
    assert compare(_facts(3, gpu))[1].per_rank == [5 * MiB, 6 * MiB]  # the allocator's peak, not the host's
    assert compare(_facts(3, []))[1] is None
    line = against_ddp(_facts(3, host))
    ddp_total = compare(_facts(0, host))[0][-1].estimated
    ddp_peak = 800 * MiB - rows[-1].estimated + ddp_total  # the same run, DDP's states in place of stage 3's
    assert ddp_peak > 800 * MiB
    assert line == f"peak 800.00 MiB per rank (physical, stage 3), DDP on this model: ~{ddp_peak / 2**30:.2f} GiB (estimate)"


def test_the_lane_footprint_mirrors_the_engine() -> None:
    from zerorun.engine.comm import shm as shared_memory
    from zerorun.estimate import transport

    for name in ("LANE_BYTES", "SLOTS", "MIN_SLOT_BYTES", "HEADER_BYTES"):
        assert getattr(transport, name) == getattr(shared_memory, name), name
    for world in (2, 3, 4, 8):
        for largest in (1000, 16 * MiB, 10**10):
            slot = shared_memory.slot_bytes_for(largest, world)
            assert transport.lane_slot_bytes(largest, world) == slot
            assert transport.lane_bytes(largest, world) == world * shared_memory.segment_bytes(slot)
    assert transport.lane_bytes(16 * MiB, 1) == 0  # one rank opens no lane


def test_measure_counts_the_lane_only_when_the_run_used_it() -> None:
    from zerorun.estimate.measure import compare
    from zerorun.estimate.transport import lane_bytes

    host = [{"host_peak_rss": 900 * MiB, "host_baseline_rss": 200 * MiB, "host_rss": 0}] * 2
    without, _, _ = compare(_facts(2, host))
    with_lane, physical, notes = compare({**_facts(2, host), "shared_memory_lane": True})
    assert "transport" not in [r.term for r in without]
    transport = next(r for r in with_lane if r.term == "transport")
    assert transport.estimated == lane_bytes(4 * (UNIT // 2), 2) == 2 * (192 + 4 * 1 * MiB)  # 1 MiB slots
    assert with_lane[-1].estimated == without[-1].estimated + transport.estimated == physical.estimated
    assert any(n.startswith("transport:") for n in notes)


def test_a_cpu_rank_adds_the_runtime_and_what_glibc_keeps_free() -> None:
    from zerorun.estimate.measure import HOST_RUNTIME, MMAP_THRESHOLD_MAX, allocator_retention, compare

    host = [{"host_peak_rss": 900 * MiB, "host_baseline_rss": 200 * MiB, "host_rss": 0}] * 2
    rows, physical, notes = compare(_facts(2, host))
    terms = {r.term: r.estimated for r in rows}
    assert terms["host_runtime"] == HOST_RUNTIME
    assert terms["allocator_retention"] == 2 * 4 * LARGEST_PARAM  # twice the largest gradient freed (fp32)
    assert physical.estimated == rows[-1].estimated == sum(v for k, v in terms.items() if k != "total")
    # stage 3 frees gathered units beside the gradients: the larger sets the thresholds, for each kind
    at3 = {r.term: r.estimated for r in compare(_facts(3, host))[0]}
    assert at3["allocator_retention"] == 2 * 2 * 4 * max(LARGEST_PARAM, UNIT // 2)
    # a GPU's peak is the CUDA allocator's: no host rows
    gpu = [{**h, "device_peak_allocated": MiB} for h in host]
    assert not {"host_runtime", "allocator_retention"} & {r.term for r in compare(_facts(2, gpu))[0]}
    # glibc's dynamic thresholds stop at 32 MiB; fixed ones keep what the trim threshold says
    assert allocator_retention(10**9, {}) == 2 * MMAP_THRESHOLD_MAX
    assert allocator_retention(10**9, {}, kinds=2) == 4 * MMAP_THRESHOLD_MAX
    assert allocator_retention(10**9, {"MALLOC_TRIM_THRESHOLD_": "131072"}, kinds=2) == 131072  # fixed: nothing moves
    assert allocator_retention(10**9, {"MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_MMAP_THRESHOLD_": "131072"}) == 131072
    assert allocator_retention(10**9, {"MALLOC_MMAP_THRESHOLD_": "65536"}) == 128 * 1024
    assert any(n.startswith("host:") for n in notes)


def test_a_ranks_allocator_environment_is_read_as_a_count_or_not_at_all() -> None:
    """The rank reports its environment's glibc thresholds: text anyone can set. Only a plain count is read."""
    from zerorun.estimate.measure import MMAP_THRESHOLD_MAX, allocator_retention, compare

    dynamic = 2 * MMAP_THRESHOLD_MAX
    for hostile in ("abc", "-5", "1e9", "", " 131072", "\u0661\u0662", "__import__('os')"):
        assert allocator_retention(10**9, {"MALLOC_TRIM_THRESHOLD_": hostile}) == dynamic, hostile
    assert allocator_retention(10**9, {"MALLOC_TRIM_THRESHOLD_": 131072}) == dynamic  # not text: not read
    assert allocator_retention(10**9, {"MALLOC_MMAP_THRESHOLD_": "x", "MALLOC_TRIM_THRESHOLD_": "7"}) == 7
    host = [{"host_peak_rss": 900 * MiB, "host_baseline_rss": 200 * MiB, "host_rss": 0}] * 2
    for env in (["MALLOC_TRIM_THRESHOLD_"], "MALLOC_TRIM_THRESHOLD_=1", 5, None):
        rows, _, _ = compare({**_facts(2, host), "allocator_env": env})
        assert {r.term: r.estimated for r in rows}["allocator_retention"] == 2 * 4 * LARGEST_PARAM, env
