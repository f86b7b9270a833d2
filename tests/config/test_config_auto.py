"""zerorun/config/auto.py: "auto" values resolved from the world size and the hidden size."""

from __future__ import annotations

import pytest

from zerorun.config import ConfigError, inspect_config, load_config

H = 4096
HF_ZERO3 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}},
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
}


def test_hidden_size_formulas() -> None:
    zero = load_config(HF_ZERO3, world_size=8, hidden_size=H).zero_optimization
    assert zero.reduce_bucket_size == H * H == 16_777_216
    assert zero.stage3_prefetch_bucket_size == int(0.9 * H * H) == 15_099_494  # an int, not 15099494.4
    assert zero.stage3_param_persistence_threshold == 10 * H


def test_without_hidden_size_the_defaults_apply_and_a_note_says_so() -> None:
    loaded = inspect_config(HF_ZERO3, world_size=8)
    zero = loaded.config.zero_optimization
    assert (zero.reduce_bucket_size, zero.stage3_prefetch_bucket_size, zero.stage3_param_persistence_threshold) == (
        500_000_000,
        50_000_000,
        100_000,
    )
    assert str(loaded.provenance["zero_optimization.reduce_bucket_size"]) == (
        "auto (hidden_size^2 at run time; default until the hidden size is known)"
    )
    assert any('"auto" is resolved at run time from the model\'s hidden size' in n.message for n in loaded.notes)


def test_batch_auto_from_the_other_keys() -> None:
    loaded = inspect_config(HF_ZERO3, world_size=8, hidden_size=H)
    cfg = loaded.config
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (32, 4, 1)
    assert str(loaded.provenance["train_batch_size"]) == "auto (from the other batch keys and world_size=8)"


def test_batch_auto_without_world_size_is_resolved_at_run_time() -> None:
    loaded = inspect_config(HF_ZERO3)
    assert loaded.config.train_batch_size is None
    assert str(loaded.provenance["train_batch_size"]) == "auto (derived at run time)"
    assert any(n.path == "train_batch_size, gradient_accumulation_steps" and "at run time" in n.message for n in loaded.notes)


def test_trainer_filled_autos_take_defaults_and_params_are_dropped() -> None:
    loaded = inspect_config(HF_ZERO3, world_size=1)
    cfg = loaded.config
    assert cfg.gradient_clipping == 1.0 and cfg.fp16.enabled is False  # DeepSpeed's default (>= 0.19.3)
    assert cfg.optimizer is not None and cfg.optimizer.params == {"weight_decay": 0.1}
    assert str(loaded.provenance["fp16.enabled"]) == "auto (nothing to resolve it from; the default)"
    assert any(n.message.startswith('"auto" dropped for lr;') for n in loaded.notes)


def test_auto_where_nothing_can_resolve_it_is_an_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"zero_optimization": {"stage": "auto", "allgather_bucket_size": "auto"}})
    assert [p.render("<dict>") for p in caught.value.problems] == [
        '<dict>: zero_optimization.stage: "auto" cannot be resolved for this key; give a value',
        '<dict>: zero_optimization.allgather_bucket_size: "auto" cannot be resolved for this key; give a value',
    ]
