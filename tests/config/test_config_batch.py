"""zerorun/config/batch.py: the batch triple, derived like DeepSpeed but never floored."""

from __future__ import annotations

import pytest

from zerorun.config import ConfigError, inspect_config, load_config
from zerorun.config.batch import BatchError, BatchPlan, implied_world_size, resolve_batch


@pytest.mark.parametrize(
    ("given", "world", "expected"),
    [
        ((32, 2, 4), 4, BatchPlan(32, 2, 4, ())),
        ((32, 2, None), 4, BatchPlan(32, 2, 4, ("gradient_accumulation_steps",))),
        ((32, None, 4), 4, BatchPlan(32, 2, 4, ("train_micro_batch_size_per_gpu",))),
        ((None, 2, 4), 4, BatchPlan(32, 2, 4, ("train_batch_size",))),
        ((32, None, None), 4, BatchPlan(32, 8, 1, ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))),
        ((None, 2, None), 4, BatchPlan(8, 2, 1, ("train_batch_size", "gradient_accumulation_steps"))),
        ((None, None, 3), 2, BatchPlan(6, 1, 3, ("train_micro_batch_size_per_gpu", "train_batch_size"))),
    ],
)
def test_any_two_derive_the_third(given: tuple, world: int, expected: BatchPlan) -> None:
    plan = resolve_batch(*given, world)
    assert plan == expected
    assert plan.train_batch_size == plan.train_micro_batch_size_per_gpu * plan.gradient_accumulation_steps * world


def test_inconsistent_triple_prints_numbers_and_fix() -> None:
    with pytest.raises(BatchError) as caught:
        resolve_batch(16, 1, 8, 1)
    assert caught.value.message == (
        "train_batch_size (16) != train_micro_batch_size_per_gpu (1) * gradient_accumulation_steps (8) * world_size (1) = 8"
    )
    assert caught.value.hint == "set train_batch_size to 8, or remove one of the three to have it derived"


def test_non_divisible_is_not_floored() -> None:
    with pytest.raises(BatchError) as caught:
        resolve_batch(10, 3, None, 1)
    assert caught.value.message == (
        "train_batch_size (10) is not divisible by train_micro_batch_size_per_gpu (3) * world_size (1) = 3, "
        "so gradient_accumulation_steps cannot be derived"
    )
    assert caught.value.hint == "set train_batch_size to 9 or 12, or give gradient_accumulation_steps instead of train_batch_size"


def test_world_size_mismatch_the_common_case() -> None:
    # a config written for 8 ranks, run on 7 (DeepSpeed issue #6914's shape)
    with pytest.raises(BatchError) as caught:
        resolve_batch(64, 4, None, 7)
    assert "train_batch_size (64) is not divisible by train_micro_batch_size_per_gpu (4) * world_size (7) = 28" in caught.value.message
    assert caught.value.hint.startswith("set train_batch_size to 56 or 84")


def test_too_small_batch_suggests_the_smallest_valid() -> None:
    with pytest.raises(BatchError) as caught:
        resolve_batch(4, 2, None, 4)
    assert caught.value.hint.startswith("set train_batch_size to 8,")


def test_implied_world_size() -> None:
    assert implied_world_size(64, 4, 2) == 8
    assert implied_world_size(64, 4, None) is None
    with pytest.raises(BatchError, match=r"train_batch_size \(10\) is not divisible by .* = 4 for any world size"):
        implied_world_size(10, 2, 2)


def test_batch_error_through_load_config() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8}, world_size=1)
    (problem,) = caught.value.problems
    assert problem.render("<dict>") == (
        "<dict>: train_batch_size: train_batch_size (16) != train_micro_batch_size_per_gpu (1) * "
        "gradient_accumulation_steps (8) * world_size (1) = 8; set train_batch_size to 8, or remove one of the three to have it derived"
    )


def test_without_world_size_values_stay_as_given() -> None:
    loaded = inspect_config({"train_micro_batch_size_per_gpu": 4})
    cfg = loaded.config
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (None, 4, None)
    with pytest.raises(ConfigError, match="for any world size"):
        load_config({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1})


def test_with_world_size_all_three_are_ints_and_provenance_says_derived() -> None:
    loaded = inspect_config({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 3}, world_size=4)
    assert loaded.config.gradient_accumulation_steps == 4
    assert str(loaded.provenance["gradient_accumulation_steps"]) == "derived (from the other batch keys and world_size=4)"
    assert str(loaded.provenance["train_batch_size"]) == "file"


def test_bad_world_size_argument() -> None:
    with pytest.raises(ConfigError, match="world_size must be a positive integer, got 0"):
        load_config(None, world_size=0)
