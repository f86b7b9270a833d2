"""hpZ's and MiCS's keys load with DeepSpeed's meaning; the combinations DeepSpeed cannot run are config errors."""

from __future__ import annotations

import warnings

import pytest

from zerorun.config import load_config
from zerorun.config.problems import ConfigError, ConfigWarning

BASE = {"train_micro_batch_size_per_gpu": 1}


def _zero(**keys: object) -> dict:
    return {**BASE, "zero_optimization": {"stage": 3, **keys}}


def test_the_keys_load_with_deepspeeds_defaults() -> None:
    zero = load_config(_zero()).zero_optimization
    assert (zero.zero_hpz_partition_size, zero.mics_shard_size, zero.mics_hierarchical_params_gather) == (1, -1, False)
    zero = load_config(_zero(zero_hpz_partition_size=8)).zero_optimization
    assert zero.zero_hpz_partition_size == 8
    zero = load_config(_zero(mics_shard_size=16, mics_hierarchical_params_gather=True)).zero_optimization
    assert (zero.mics_shard_size, zero.mics_hierarchical_params_gather) == (16, True)


def test_hpz_with_mics_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="zero_hpz_partition_size: is set together with mics_shard_size"):
        load_config(_zero(zero_hpz_partition_size=2, mics_shard_size=2))


def test_a_hierarchical_gather_needs_mics() -> None:
    with pytest.raises(ConfigError, match="mics_hierarchical_params_gather: is set without mics_shard_size"):
        load_config(_zero(mics_hierarchical_params_gather=True))


@pytest.mark.parametrize(("key", "value"), [("mics_shard_size", -2), ("zero_hpz_partition_size", -1)])
def test_a_size_below_deepspeeds_off_value_is_refused(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(_zero(**{key: value}))


def test_below_stage3_they_have_no_effect() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config({**BASE, "zero_optimization": {"stage": 2, "mics_shard_size": 2}})
    assert any(issubclass(w.category, ConfigWarning) and "mics_shard_size" in str(w.message) for w in caught)
