"""DeepSpeed's ZeRO++ and MiCS keys (config/not_yet.py): refused naming what they are, their off values load."""

from __future__ import annotations

import pytest

from zerorun.config import load_config
from zerorun.config.not_yet import NOT_YET
from zerorun.config.problems import ConfigError

BASE = {"train_micro_batch_size_per_gpu": 1}


@pytest.mark.parametrize(("key", "value"), [
    ("zero_hpz_partition_size", 8), ("mics_shard_size", 64), ("mics_hierarchical_params_gather", True),
    ("zero_quantized_weights", True), ("zero_quantized_nontrainable_weights", True),
    ("zero_quantized_gradients", True), ("zeropp_loco_param", {"err_beta": 0.8, "reset_T": 1024}),
])
def test_a_key_the_engine_does_not_implement_is_refused_with_what_it_is(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({**BASE, "zero_optimization": {"stage": 3, key: value}})
    text = str(err.value)
    assert f"zero_optimization.{key}: DeepSpeed's" in text and "does not implement it yet" in text
    assert "unknown key" not in text and "did you mean" not in text
    assert f"zero_optimization.{key}" in NOT_YET


def test_deepspeeds_off_values_load_as_if_absent() -> None:
    off = {"zero_hpz_partition_size": 1, "mics_shard_size": -1, "mics_hierarchical_params_gather": False,
           "zero_quantized_weights": False, "zero_quantized_nontrainable_weights": False,
           "zero_quantized_gradients": False, "zeropp_loco_param": None}
    cfg = load_config({**BASE, "zero_optimization": {"stage": 3, **off}})
    assert cfg.zero_optimization.stage == 3
    with pytest.raises(ConfigError, match="zero_hpz_partition_size: DeepSpeed's"):  # a string "1" is not an off value
        load_config({**BASE, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": "1"}})
