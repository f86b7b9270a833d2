"""DeepSpeed's ZeRO++ and MiCS keys (config/not_yet.py): refused naming what they are, their off values load."""

from __future__ import annotations

import pytest

from zerorun.config import load_config
from zerorun.config.not_yet import NOT_YET
from zerorun.config.problems import ConfigError

BASE = {"train_micro_batch_size_per_gpu": 1}


@pytest.mark.parametrize(("key", "value"), [
    ("zeropp_loco_param", {"err_beta": 0.8, "reset_T": 1024}),
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
           "zeropp_loco_param": None}
    cfg = load_config({**BASE, "zero_optimization": {"stage": 3, **off}})
    assert cfg.zero_optimization.stage == 3
    with pytest.raises(ConfigError, match="zeropp_loco_param: DeepSpeed's"):  # a string is not an off value
        load_config({**BASE, "zero_optimization": {"stage": 3, "zeropp_loco_param": "null"}})


QUANTIZED = ("zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients")


def test_zeropps_quantized_keys_load_at_stage_3() -> None:
    cfg = load_config({**BASE, "zero_optimization": {"stage": 3, **dict.fromkeys(QUANTIZED, True)}})
    assert all(getattr(cfg.zero_optimization, key) is True for key in QUANTIZED)
    assert not any(f"zero_optimization.{key}" in NOT_YET for key in QUANTIZED)
    with pytest.raises(ConfigError, match="zero_quantized_weights"):  # a bool, as DeepSpeed's schema says
        load_config({**BASE, "zero_optimization": {"stage": 3, "zero_quantized_weights": "int8"}})


@pytest.mark.parametrize("key", QUANTIZED)
def test_below_stage_3_they_warn_that_they_change_nothing(key: str) -> None:
    """DeepSpeed 0.19.8 reads them only in its stage-3 optimizer (elsewhere they are silently unused)."""
    from zerorun.config.problems import ConfigWarning

    with pytest.warns(ConfigWarning, match=f"zero_optimization.{key}: has no effect at stage 2 \\(stage 3 only\\)"):
        cfg = load_config({**BASE, "zero_optimization": {"stage": 2, key: True}})
    assert getattr(cfg.zero_optimization, key) is True  # loaded; the stage-2 engine never reads it
