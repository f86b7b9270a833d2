"""zerorun/config schema: strict types, ranges, unknown keys with suggestions, all errors at once."""

from __future__ import annotations

from typing import Any

import pytest

from zerorun.config import ConfigError, ZerorunConfig, load_config
from zerorun.config.keys import fields


def errors(source: Any, **kwargs: Any) -> list[str]:
    """The rendered error lines ``load_config`` raises for ``source``."""
    with pytest.raises(ConfigError) as caught:
        load_config(source, **kwargs)
    return [problem.render(caught.value.origin) for problem in caught.value.problems]


def test_defaults_are_deepspeeds() -> None:
    cfg = load_config(None)
    zero = cfg.zero_optimization
    assert isinstance(cfg, ZerorunConfig)
    assert (zero.stage, zero.reduce_bucket_size, zero.allgather_bucket_size) == (0, 500_000_000, 500_000_000)
    assert (zero.stage3_prefetch_bucket_size, zero.stage3_param_persistence_threshold) == (50_000_000, 100_000)
    assert zero.offload_optimizer.device == zero.offload_param.device == "none"
    assert zero.overlap_comm is False  # derived: false below stage 3
    assert cfg.fp16.loss_scale == 0.0 and cfg.fp16.initial_scale_power == 16 and cfg.fp16.hysteresis == 2
    assert cfg.gradient_clipping == 1.0 and cfg.steps_per_print == 10 and cfg.optimizer is None
    assert load_config({"zero_optimization": {"stage": 3}}).zero_optimization.overlap_comm is True


def test_every_field_is_documented() -> None:
    undocumented = [path for path, info in fields().items() if not info.description]
    assert undocumented == []


def test_float_counts_convert_exactly() -> None:
    cfg = load_config({"zero_optimization": {"reduce_bucket_size": 5e8, "stage3_max_live_parameters": 1e9, "stage": 2.0}})
    assert cfg.zero_optimization.reduce_bucket_size == 500_000_000
    assert type(cfg.zero_optimization.reduce_bucket_size) is int
    assert cfg.zero_optimization.stage3_max_live_parameters == 1_000_000_000
    assert cfg.zero_optimization.stage == 2


def test_fractional_count_is_rejected() -> None:
    assert errors({"zero_optimization": {"reduce_bucket_size": 2.5e-1}}) == [
        "<dict>: zero_optimization.reduce_bucket_size: expected an integer, got 0.25, which has a fractional part"
    ]


def test_stage_out_of_range_names_the_path() -> None:
    assert errors({"zero_optimization": {"stage": 4}}) == ["<dict>: zero_optimization.stage: 4 is not one of 0, 1, 2, 3"]


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ({"fp16": {"enabled": "yes"}}, "fp16.enabled: expected true or false, got \"yes\""),
        ({"steps_per_print": True}, "steps_per_print: expected an integer, got true"),
        ({"gradient_clipping": "1.0"}, 'gradient_clipping: expected a number, got "1.0"'),
        ({"gradient_clipping": -1}, "gradient_clipping: -1 is below the minimum 0.0"),
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu: 0 is below the minimum 1"),
        ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}}, 'zero_optimization.offload_optimizer.device: "gpu" is not one of none, cpu, nvme'),
        ({"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}}, "zero_optimization.offload_optimizer.ratio: 1.5 is not between 0 and 1"),
        ({"communication_data_type": "fp8"}, 'communication_data_type: "fp8" is not a dtype here: use one of fp32 (float32/float), fp16 (float16/half), bf16 (bfloat16/torch.bfloat16)'),
        ({"zero_optimization": 3}, "zero_optimization: expected a block of keys (a mapping), got 3"),
        ({"optimizer": {"params": {}}}, "optimizer.type: is required in this block"),
    ],
)
def test_wrong_types_and_ranges(source: dict[str, Any], line: str) -> None:
    assert errors(source) == [f"<dict>: {line}"]


def test_unknown_optimizer_suggests() -> None:
    assert errors({"optimizer": {"type": "AdamWW"}}) == [
        '<dict>: optimizer.type: unknown optimizer "AdamWW" (did you mean AdamW?); known: '
        "Adam, AdamW, SGD, Adagrad, Adadelta, Adamax, NAdam, RAdam, RMSprop"
    ]
    assert load_config({"optimizer": {"type": "adamw"}}).optimizer.type == "AdamW"


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ({"train_batchsize": 8}, "train_batchsize: unknown key (did you mean train_batch_size?)"),
        ({"zero_optimization": {"stgae": 2}}, "zero_optimization.stgae: unknown key (did you mean zero_optimization.stage?)"),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memroy": True}}},
            "zero_optimization.offload_optimizer.pin_memroy: unknown key (did you mean zero_optimization.offload_optimizer.pin_memory?)",
        ),
        (
            {"overlap_comm": True},
            "overlap_comm: unknown key here; it belongs in zero_optimization (did you mean zero_optimization.overlap_comm?)",
        ),
        (
            {"bf16": {"enabled": True, "loss_scale": 0}},
            "bf16.loss_scale: unknown key here; it belongs in fp16 (did you mean fp16.loss_scale?)",
        ),
        ({"aio": {"qeue_depth": 8}}, "aio.qeue_depth: unknown key (did you mean aio.queue_depth?)"),
        ({"zzz_nothing_like_it": 1}, "zzz_nothing_like_it: unknown key"),
    ],
)
def test_unknown_keys_at_every_level(source: dict[str, Any], line: str) -> None:
    assert errors(source) == [f"<dict>: {line}"]


def test_all_errors_reported_at_once() -> None:
    lines = errors(
        {
            "tran_batch_size": 3,
            "zero_optimization": {"stage": 4, "reduce_bucket_size": 0.5},
            "fp16": {"enabled": True},
            "bf16": {"enabled": True},
        }
    )
    assert len(lines) == 4
    assert any("zero_optimization.stage: 4 is not one of" in line for line in lines)
    assert any("reduce_bucket_size: expected an integer" in line for line in lines)
    assert any("tran_batch_size: unknown key" in line for line in lines)
    assert any("fp16 and bf16 are both enabled" in line for line in lines)


def test_error_message_and_hint_shape() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"zero_optimization": {"stage": 4}, "fp17": {}})
    err = caught.value
    assert err.message.splitlines()[0] == "<dict>: 2 problems in the config:"
    assert "print-config" in (err.hint or "")


def test_config_is_frozen() -> None:
    cfg = load_config(None)
    with pytest.raises(Exception, match="frozen"):
        cfg.zero_optimization.stage = 3  # type: ignore[misc]
