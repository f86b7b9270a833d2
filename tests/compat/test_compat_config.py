"""Configs of real DeepSpeed examples load; features zerorun lacks fail naming the feature.

Covers the keys DeepSpeed accepts that zerorun used to reject as unknown, the blocks
DeepSpeed leaves off unless enabled, the optimizer types zerorun does not implement,
and JSON with comments and a UTF-8 byte-order mark (DeepSpeed reads configs with hjson).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from zerorun.config import ConfigError, ConfigWarning, load_config

BASE = {"train_micro_batch_size_per_gpu": 2}


def _warnings_of(cfg: dict) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config({**BASE, **cfg})
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


@pytest.mark.parametrize("cfg", [
    {"cuda_visible_devices": "0,1"},
    {"data_efficiency": {"enabled": False, "seed": 1234}},
    {"data_efficiency": {"data_sampling": {"enabled": False}}},  # DeepSpeed's enabled defaults to false
    {"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": False}}}},
    {"timers": {"throughput": {"enabled": True}}},
    {"sparse_gradients": True},
    {"vocabulary_size": 50304},
    {"compile": {"deepcompile": False}},
    {"tensor_parallel": {"autotp_size": 1}},
    {"pipeline": {"activation_checkpoint_interval": 0}},
    {"gradient_allreduce_op": "mean", "managed_gradient_accumulation": True},
    {"data_types": {"grad_accum_dtype": None}},
])
def test_keys_of_real_configs_load(cfg: dict) -> None:
    messages = _warnings_of(cfg)
    key = next(iter(cfg))
    if key not in ("gradient_allreduce_op", "data_types"):  # the exact-default keys load silently
        assert any(m.split(": ", 2)[1] == key for m in messages), messages


@pytest.mark.parametrize(("cfg", "feature"), [
    ({"data_efficiency": {"enabled": True}}, "data efficiency"),
    ({"curriculum_learning": {"enabled": True}}, "curriculum learning"),
    ({"compression_training": {"sparse_pruning": {"shared_parameters": {"enabled": True}}}}, "compression training"),
    ({"compile": {"deepcompile": True}}, "DeepCompile"),
    ({"tensor_parallel": {"autotp_size": 2}}, "tensor parallelism"),
    ({"sequence_parallel_size": 2}, "sequence parallelism"),
    ({"progressive_layer_drop": {"enabled": True}}, "progressive layer drop"),
    ({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}, "Lamb optimizer"),
    ({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}}, "1-bit Adam optimizer"),
    ({"optimizer": {"type": "onebitlamb"}}, "1-bit Lamb optimizer"),
    ({"optimizer": {"type": "ZeroOneAdam"}}, "0/1 Adam optimizer"),
])
def test_missing_features_fail_naming_the_feature(cfg: dict, feature: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, **cfg})
    text = str(caught.value)
    assert feature in text and "unknown" not in text
    assert len(caught.value.problems) == 1


def test_json_with_comments_and_a_byte_order_mark(tmp_path: Path) -> None:
    text = """{
  // micro batch per GPU
  "train_micro_batch_size_per_gpu": 4,  /* inline */
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},   # hjson-style comment
  /* a block
     comment */
  "steps_per_print": 7,
  "wall_clock_breakdown": false, "comment_in_string": "http://x//y /* not a comment */"
}"""
    path = tmp_path / "ds_config.json"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace(', "comment_in_string": "http://x//y /* not a comment */"', "")
                     .encode())
    cfg = load_config(path)
    assert (cfg.train_micro_batch_size_per_gpu, cfg.steps_per_print, cfg.optimizer.params["lr"]) == (4, 7, 3e-4)
    # a string that holds comment markers is left alone (reported as the unknown key it is)
    path.write_text(text)
    with pytest.raises(ConfigError, match="comment_in_string: unknown key"):
        load_config(path)


def test_malformed_json_after_comments_keeps_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  // one\n  /* two\n  three */\n  "steps_per_print": 7,,\n}')
    with pytest.raises(ConfigError, match="line 5"):
        load_config(path)


def test_plain_json_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({**BASE, "steps_per_print": 3}))
    assert load_config(path).steps_per_print == 3


def test_compile_block_torch_compile_keys_and_deepcompile_knobs() -> None:
    """DeepSpeed 0.13.2-0.14.3's ``compile`` keys (torch.compile at initialize) load silently into the schema;
    DeepCompile's knobs beside them (it off) warn and are dropped; a misspelt key is named."""
    torch_keys = {"enabled": True, "backend": "aot_eager", "kwargs": {"dynamic": False}}
    assert _warnings_of({"compile": torch_keys}) == []
    cfg = load_config({**BASE, "compile": torch_keys})
    assert (cfg.compile.enabled, cfg.compile.backend, cfg.compile.kwargs) == (True, "aot_eager", {"dynamic": False})
    assert not load_config(BASE).compile.enabled
    mixed = {"compile": {"deepcompile": False, "free_activation": True, "enabled": True}}
    assert [m for m in _warnings_of(mixed) if "DeepCompile" in m]
    assert load_config({**BASE, **mixed}).compile.enabled
    with pytest.raises(ConfigError, match="compile.enabeld"):
        load_config({**BASE, "compile": {"enabeld": True}})
