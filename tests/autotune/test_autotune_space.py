"""The search space per stage, grids around the hidden-size rules, micro-batch pairs."""

from __future__ import annotations

import pytest

from zerorun.autotune.space import (
    ACCUMULATION,
    MICRO_BATCH,
    SpaceError,
    build_space,
    hidden_size_centres,
    log_grid,
    micro_batch_choices,
    refine,
    with_value,
)


def test_knobs_depend_on_the_stage() -> None:
    # only what the bundled engine reads: DeepSpeed's allgather_bucket_size and contiguous_gradients
    # change nothing here, nor does reduce_bucket_size at stage 3 (gradients are reduced per unit)
    assert build_space(2, {}).knobs == ("reduce_bucket_size", "overlap_comm")
    s3 = build_space(3, {})
    assert set(s3.knobs) == {
        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
        "stage3_max_live_parameters", "stage3_max_reuse_distance", "overlap_comm",
    }
    with pytest.raises(SpaceError):
        build_space(0, {})


def test_hidden_size_rules_centre_the_grids() -> None:
    assert hidden_size_centres(4096) == {
        "reduce_bucket_size": 16_777_216, "allgather_bucket_size": 16_777_216,
        "stage3_prefetch_bucket_size": 15_099_494, "stage3_param_persistence_threshold": 40_960,
    }
    space = build_space(2, {"reduce_bucket_size": 5e8}, hidden_size=4096)
    assert space.values["reduce_bucket_size"] == (1_048_576, 4_194_304, 16_777_216, 67_108_864, 268_435_456)
    assert space.start["reduce_bucket_size"] == 5e8  # the user's config is the baseline
    s3 = build_space(3, {"stage3_param_persistence_threshold": 7}, hidden_size=4096)
    assert s3.values["stage3_param_persistence_threshold"][2] == 40_960
    assert s3.start["stage3_param_persistence_threshold"] == 7
    assert s3.start["overlap_comm"] is True  # unset: DeepSpeed's stage-3 default


def test_without_hidden_size_grids_centre_on_the_start() -> None:
    space = build_space(2, {"reduce_bucket_size": 1000, "overlap_comm": False})
    assert space.values["reduce_bucket_size"] == (62, 250, 1000, 4000, 16000)
    assert space.values["overlap_comm"] == (True, False)
    assert set(space.start) == {"reduce_bucket_size", "overlap_comm"}


def test_log_grid_bounds_and_even_sizes() -> None:
    assert log_grid(3, factor=2, each_side=2) == [1, 2, 3, 6, 12]
    assert all(v % 2 == 0 for v in log_grid(1001, even=True))
    with pytest.raises(SpaceError):
        log_grid(0)


def test_refine_adds_geometric_midpoints() -> None:
    assert refine([100, 400, 1600], 400) == [200, 800]
    assert refine([100, 400], 100) == [200]
    assert refine([100, 200], 200) == [141]


def test_micro_batch_pairs_keep_the_global_batch() -> None:
    pairs = micro_batch_choices(64, 4, max_micro_batch=8)
    assert pairs == [(1, 16), (2, 8), (4, 4), (8, 2)]
    assert all(m * g * 4 == 64 for m, g in pairs)
    with pytest.raises(SpaceError, match="does not divide"):
        micro_batch_choices(10, 4)
    space = build_space(2, {MICRO_BATCH: 2}, micro_batches=pairs)
    assert (space.start[MICRO_BATCH], space.start[ACCUMULATION]) == (2, 8)
    moved = with_value(space.start, MICRO_BATCH, 8)
    assert (moved[MICRO_BATCH], moved[ACCUMULATION]) == (8, 2)
