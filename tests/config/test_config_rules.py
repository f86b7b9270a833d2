"""zerorun/config cross-field rules, deprecated aliases, DeepSpeed-only blocks, the client-optimizer check."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from zerorun.config import ConfigError, ConfigWarning, check_client_optimizer, inspect_config, load_config


def errors(source: dict[str, Any], **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(source, **kwargs)
    return [problem.render(caught.value.origin) for problem in caught.value.problems]


def warning_lines(source: dict[str, Any]) -> list[str]:
    loaded = inspect_config(source)
    return [problem.render(loaded.origin) for problem in loaded.warnings]


def test_fp16_and_bf16_together() -> None:
    assert errors({"fp16": {"enabled": True}, "bf16": {"enabled": True}}) == [
        "<dict>: fp16.enabled: fp16 and bf16 are both enabled; enable at most one of fp16.enabled and bf16.enabled"
    ]


@pytest.mark.parametrize("block", ["offload_optimizer", "offload_param"])
def test_nvme_without_path(block: str) -> None:
    source = {"zero_optimization": {"stage": 3, block: {"device": "nvme"}}}
    assert errors(source) == [
        f"<dict>: zero_optimization.{block}.nvme_path: zero_optimization.{block}.device is nvme "
        "but nvme_path is not set; set it to a directory on a local NVMe drive"
    ]


@pytest.mark.parametrize("stage", [0, 2])
def test_offload_param_below_stage3_is_ignored_with_a_warning(stage: int) -> None:
    """DeepSpeed ignores offload_param below stage 3 (its ZeRO-3 engine alone reads it): a warning, and it loads."""
    source = {"zero_optimization": {"stage": stage, "offload_param": {"device": "cpu"}}}
    assert warning_lines(source) == [
        f"<dict>: zero_optimization.offload_param.device: parameter offload (cpu) needs zero_optimization.stage 3, "
        f"but stage is {stage}: ignored, as DeepSpeed does; set stage: 3, or offload_param.device: none "
        "(offload_optimizer works from stage 1)"
    ]
    with pytest.warns(ConfigWarning, match="ignored, as DeepSpeed does"):
        assert load_config(source).zero_optimization.stage == stage


def test_offload_optimizer_needs_a_stage_and_partial_offload_needs_stage3() -> None:
    assert errors({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}) == [
        "<dict>: zero_optimization.offload_optimizer.device: optimizer offload (cpu) needs zero_optimization.stage 1, 2 or 3, but stage is 0"
    ]
    assert errors({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}) == [
        "<dict>: zero_optimization.offload_optimizer.ratio: partial offload (ratio 0.5) needs zero_optimization.stage 3, but stage is 2"
    ]


def test_amp_is_rejected_when_enabled() -> None:
    assert errors({"amp": {"enabled": True, "opt_level": "O2"}}) == [
        "<dict>: amp.enabled: apex AMP is not supported by zerorun; set amp.enabled: false and fp16.enabled: true (or bf16.enabled: true)"
    ]
    assert load_config({"amp": {"enabled": False, "opt_level": "O2"}}).amp.opt_level == "O2"


def test_bf16_masters_follow_deepspeeds_rules() -> None:
    both = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    assert load_config({"zero_optimization": {"stage": 3}, "bf16": both}).bf16.bf16_optimizer_states
    assert errors({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}
                  ) == ["<dict>: fp16.fp16_master_weights_and_grads: is not supported: fp16 masters lose updates "
                        "under loss scaling; use bf16 with bf16.bf16_master_weights_and_grads, or remove it"]
    assert errors({"bf16": both}) == [
        "<dict>: bf16.bf16_master_weights_and_grads: needs zero_optimization.stage 1, 2 or 3 (as in DeepSpeed), "
        "but stage is 0"]
    assert errors({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True, "bf16_optimizer_states": True}}) == [
        "<dict>: bf16.bf16_optimizer_states: needs bf16.bf16_master_weights_and_grads: true (as in DeepSpeed)"]
    assert errors({"zero_optimization": {"stage": 1}, "bf16": {"bf16_master_weights_and_grads": True,
                                                              "bf16_optimizer_states": True}}) == [
        "<dict>: bf16.bf16_master_weights_and_grads: needs bf16.enabled: true"]


def test_torch_autocast_is_bfloat16_over_fp32_or_bf16_parameters() -> None:
    assert load_config({"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}).torch_autocast.dtype == "bf16"
    assert errors({"torch_autocast": {"enabled": True, "dtype": "float16"}}) == [
        "<dict>: torch_autocast.dtype: fp16 is not supported: zerorun runs autocast in bfloat16 only (fp16 "
        "autocast needs a gradient scaler); set it to bf16"]
    both = load_config({"torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"}, "bf16": {"enabled": True}})
    assert both.torch_autocast.enabled and both.bf16.enabled
    assert errors({"torch_autocast": {"enabled": True}, "fp16": {"enabled": True}}) == [
        "<dict>: torch_autocast.enabled: cannot be combined with fp16.enabled (fp16 autocast needs a gradient "
        "scaler); use bf16.enabled, or neither"]


def test_stage3_keys_below_stage3_warn() -> None:
    source = {"zero_optimization": {"stage": 2, "stage3_max_live_parameters": 2e9, "stage3_prefetch_bucket_size": 5e7}}
    # the prefetch size equals the default, so only the changed key is reported
    assert warning_lines(source) == [
        "<dict>: zero_optimization.stage3_max_live_parameters: has no effect at stage 2 (stage 3 only)"
    ]
    with pytest.warns(ConfigWarning, match="stage3_max_live_parameters: has no effect at stage 2"):
        load_config(source)


def test_rule_skipped_when_its_key_is_invalid() -> None:
    # stage 4 is invalid; "offload_param needs stage 3" would be noise on top of it.
    assert errors({"zero_optimization": {"stage": 4, "offload_param": {"device": "cpu"}}}) == [
        "<dict>: zero_optimization.stage: 4 is not one of 0, 1, 2, 3"
    ]


@pytest.mark.parametrize(
    ("source", "new_path", "expected", "message"),
    [
        (
            {"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True}},
            "stage3_gather_16bit_weights_on_model_save",
            True,
            "zero_optimization.stage3_gather_fp16_weights_on_model_save: is deprecated; use zero_optimization.stage3_gather_16bit_weights_on_model_save",
        ),
        (
            {"zero_optimization": {"stage": 2, "cpu_offload": True}},
            "offload_optimizer",
            "cpu",
            "zero_optimization.cpu_offload: is deprecated; use zero_optimization.offload_optimizer.device: cpu",
        ),
        (
            {"zero_optimization": {"stage": 3, "cpu_offload_params": True}},
            "offload_param",
            "cpu",
            "zero_optimization.cpu_offload_params: is deprecated; use zero_optimization.offload_param.device: cpu",
        ),
        (
            {"zero_optimization": {"stage": 3, "cpu_offload_param": True}},
            "offload_param",
            "cpu",
            "zero_optimization.cpu_offload_param: is deprecated; use zero_optimization.offload_param.device: cpu",
        ),
        (
            {"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1e7}},
            "stage3_prefetch_bucket_size",
            10_000_000,
            "zero_optimization.prefetch_bucket_size: is deprecated; use zero_optimization.stage3_prefetch_bucket_size",
        ),
    ],
)
def test_deprecated_names_map_with_a_warning(source: dict[str, Any], new_path: str, expected: Any, message: str) -> None:
    loaded = inspect_config(source)
    value = getattr(loaded.config.zero_optimization, new_path)
    assert (value.device if new_path.startswith("offload") else value) == expected
    assert [p.render("<dict>") for p in loaded.warnings] == [f"<dict>: {message}"]


def test_pin_memory_alias_and_legacy_top_level_names() -> None:
    loaded = inspect_config(
        {"bfloat16": {"enabled": True}, "zero_optimization": {"stage": 2, "cpu_offload": True, "cpu_offload_use_pin_memory": True}}
    )
    assert loaded.config.bf16.enabled is True
    assert loaded.config.zero_optimization.offload_optimizer.pin_memory is True
    assert str(loaded.provenance["bf16.enabled"]) == "deprecated alias (from bfloat16)"
    assert str(loaded.provenance["zero_optimization.offload_optimizer.pin_memory"]) == (
        "deprecated alias (from zero_optimization.cpu_offload_use_pin_memory)"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_config({"zero_optimization": True}).zero_optimization.stage == 1
    assert "zero_optimization: true/false is deprecated; use zero_optimization: {stage: 1}" in str(caught[0].message)


def test_old_and_new_name_together_is_an_error() -> None:
    source = {"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True, "stage3_gather_16bit_weights_on_model_save": False}}
    assert errors(source) == [
        "<dict>: zero_optimization.stage3_gather_fp16_weights_on_model_save: is the deprecated name of "
        "zero_optimization.stage3_gather_16bit_weights_on_model_save; give only zero_optimization.stage3_gather_16bit_weights_on_model_save"
    ]


def test_deepspeed_only_blocks() -> None:
    assert warning_lines({"tensorboard": {"enabled": True}, "wandb": {"enabled": False}}) == [
        "<dict>: tensorboard: is a DeepSpeed key that zerorun accepts but ignores",
        "<dict>: wandb: is a DeepSpeed key that zerorun accepts but ignores",
    ]
    assert errors({"elasticity": {"enabled": True}}) == [
        "<dict>: elasticity.max_train_batch_size: an enabled elasticity block needs max_train_batch_size; "
        'add e.g. "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6]']
    assert load_config({"elasticity": {"enabled": False}}) == load_config(None)


def test_client_optimizer_with_config_optimizer_wins_with_a_warning() -> None:
    cfg = load_config({"optimizer": {"type": "AdamW"}})
    with pytest.warns(ConfigWarning, match=r"config's optimizer block \(AdamW\) is ignored: .* \(SGD\), which is used"):
        check_client_optimizer(cfg, True, "SGD")
    check_client_optimizer(cfg, False)
    check_client_optimizer(load_config(None), True, "AdamW")


def test_untested_client_optimizer_needs_the_flag() -> None:
    cfg = load_config({"zero_optimization": {"stage": 2}})
    with pytest.raises(ConfigError, match="the client optimizer Lion is untested with ZeRO stage 2"):
        check_client_optimizer(cfg, True, "Lion")
    check_client_optimizer(load_config({"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}), True, "Lion")
    check_client_optimizer(load_config(None), True, "Lion")  # stage 0: plain data parallel, any optimizer
