"""Config DeepSpeed 0.19.8 accepts, accepted here: ``data_types.grad_accum_dtype`` (with its stage-0 rule),
``zero_allow_untested_optimizer: 1`` (an int), ``offload_param`` below stage 3 (ignored, with a warning),
``memory_efficient_linear`` and ``stage3_use_all_reduce_for_fetch_params`` (no effect, warned)."""

from __future__ import annotations

import warnings

import pytest

from zerorun.config import ConfigError, ConfigWarning, check_grad_accum_dtype, load_config


def _quiet(source: dict) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(source)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("accum", ["fp32", "bf16", "fp16"])
def test_grad_accum_dtype_is_accepted_at_every_zero_stage(stage: int, accum: str) -> None:
    cfg = _quiet({"bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
                  "data_types": {"grad_accum_dtype": accum}})
    assert cfg.data_types.grad_accum_dtype == accum
    check_grad_accum_dtype(cfg)  # DeepSpeed's ZeRO optimizers take any mix


@pytest.mark.parametrize(("model", "accum", "ok"), [
    ("fp32", None, True), ("fp32", "fp32", True), ("bf16", "bf16", True), ("bf16", None, True),
    ("bf16", "fp32", False), ("fp32", "bf16", False), ("fp16", "fp32", False), ("fp16", "fp16", True)])
def test_grad_accum_dtype_at_stage0_must_be_the_training_dtype(model: str, accum: str | None, ok: bool) -> None:
    """DeepSpeed's stage-0 wrappers: the same dtype or NotImplementedError("unsupported mix of ...")."""
    source: dict = {"zero_optimization": {"stage": 0}, "data_types": {"grad_accum_dtype": accum}}
    if model != "fp32":
        source[model] = {"enabled": True}
    cfg = _quiet(source)
    if ok:
        check_grad_accum_dtype(cfg)
        return
    with pytest.raises(NotImplementedError, match="unsupported mix of model_dtype=torch"):
        check_grad_accum_dtype(cfg)


def test_other_data_types_stay_refused() -> None:
    with pytest.raises(ConfigError, match="data_types.buffer_dtype"):
        load_config({"data_types": {"buffer_dtype": "fp32"}})


@pytest.mark.parametrize(("value", "expected"), [(1, True), (0, False), (True, True)])
def test_zero_allow_untested_optimizer_takes_0_and_1(value: object, expected: bool) -> None:
    assert load_config({"zero_allow_untested_optimizer": value}).zero_allow_untested_optimizer is expected


def test_zero_allow_untested_optimizer_refuses_other_ints() -> None:
    with pytest.raises(ConfigError, match="zero_allow_untested_optimizer"):
        load_config({"zero_allow_untested_optimizer": 2})


def test_offload_param_at_stage0_loads_and_warns() -> None:
    with pytest.warns(ConfigWarning, match="offload_param.device: .* ignored, as DeepSpeed does"):
        cfg = load_config({"zero_optimization": {"stage": 0, "offload_param": {"device": "cpu"}}})
    assert cfg.zero_optimization.stage == 0


@pytest.mark.parametrize("key", ["memory_efficient_linear", "stage3_use_all_reduce_for_fetch_params"])
def test_stage3_keys_deepspeeds_zero_tests_set_load_and_warn(key: str) -> None:
    """DeepSpeed's stage-3 keys with no counterpart in zerorun's engine: accepted, warned about when set
    away from their default."""
    value = key == "stage3_use_all_reduce_for_fetch_params"  # the other's default is True
    with pytest.warns(ConfigWarning, match=f"zero_optimization.{key}: is accepted"):
        cfg = load_config({"zero_optimization": {"stage": 3, key: value}})
    assert getattr(cfg.zero_optimization, key) is value
