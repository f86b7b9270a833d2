"""DeepSpeed's config models and config entry points with DeepSpeed's semantics
(zerorun/compat/config_models.py, precision_config.py, config_keys.py, config/read.py's Hjson, errors that pickle)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from zerorun.compat.config import DeepSpeedConfig, get_gradient_clipping
from zerorun.compat.config_keys import GRADIENT_CLIPPING_DEFAULT
from zerorun.compat.config_models import (
    DeepSpeedConfigModel,
    DeepSpeedZeroConfig,
    DeepSpeedZeroOffloadOptimizerConfig,
    DeepSpeedZeroOffloadParamConfig,
)
from zerorun.compat.precision_config import get_bfloat16_config, get_float16_config
from zerorun.config.problems import ConfigError, Problem
from zerorun.errors import UsageError


class Conf(DeepSpeedConfigModel):
    param_1: int = 0
    param_2_old: str | None = Field(None, json_schema_extra={"deprecated": True, "new_param": "param_2",
                                                             "new_param_fn": lambda x: [x]})
    param_2: list[str] | None = None
    param_3: int = Field(0, alias="param_3_alias")


def test_config_model_contract() -> None:
    assert Conf(param_1=42).param_1 == 42
    assert Conf(param_2_old="DS").param_2 == ["DS"]  # the deprecated field moves to its replacement
    assert Conf(param_3=10).param_3 == Conf(param_3_alias=10).param_3 == 10
    assert Conf(param_1="auto").param_1 == 0  # "auto" is the default unless strict
    for bad in ({"param_1": "DS"}, {"param_2": "DS"}, {"param_1_typo": 0}):
        with pytest.raises(ValidationError):
            Conf(**bad)
    with pytest.raises(ValidationError):
        Conf(strict=True, param_1="auto")
    with pytest.raises(AssertionError, match="together"):
        Conf(param_2=["DS"], param_2_old="DS")


def test_zero_config_by_deepspeed_s_names() -> None:
    assert isinstance(DeepSpeedZeroConfig(cpu_offload_param=True).offload_param, DeepSpeedZeroOffloadParamConfig)
    assert DeepSpeedZeroConfig(cpu_offload=True).offload_optimizer.device == "cpu"
    assert DeepSpeedZeroConfig(stage3_gather_fp16_weights_on_model_save=True).gather_16bit_weights_on_model_save
    assert DeepSpeedZeroConfig(stage3_prefetch_bucket_size=12345).prefetch_bucket_size == 12345
    assert DeepSpeedZeroConfig(max_reuse_distance=7).max_reuse_distance == 7  # the Python name as input too
    assert [DeepSpeedZeroConfig(stage=s).overlap_comm for s in range(4)] == [False, False, False, True]
    assert DeepSpeedZeroConfig(overlap_comm=False, stage=3).overlap_comm is False
    plain = DeepSpeedZeroConfig(offload_param=None, offload_optimizer=None)
    assert (plain.offload_param, plain.offload_optimizer, plain.pipeline_loading_checkpoint) == (None, None, False)
    assert isinstance(DeepSpeedZeroConfig(offload_optimizer={}).offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig)
    with pytest.raises(ValidationError):
        DeepSpeedZeroConfig(stage=7)
    assert DeepSpeedZeroConfig(stage=3, pipeline_loading_checkpoint=True).pipeline_loading_checkpoint is True


def test_zero3_elastic_checkpoint_warns_as_deepspeed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="DeepSpeed"):
        DeepSpeedZeroConfig(stage=2, elastic_checkpoint=True)
        assert not caplog.records
        DeepSpeedZeroConfig(stage=3, elastic_checkpoint=True)
    assert [r.getMessage() for r in caplog.records] == [
        "ZeRO-3 elastic checkpointing is deprecated and no longer supported. Use Universal Checkpointing instead."]


@pytest.mark.parametrize(("read", "write", "pipeline"), [(False, False, False), (True, False, True),
                                                         (False, True, True), (True, True, True)])
def test_offload_optimizer_pipeline_is_derived(read: bool, write: bool, pipeline: bool) -> None:
    assert DeepSpeedZeroOffloadOptimizerConfig(pipeline_read=read, pipeline_write=write).pipeline is pipeline


def test_precision_blocks_and_the_clipping_default() -> None:
    assert get_bfloat16_config({"bf16": {"enabled": True}}).enabled
    assert get_bfloat16_config({"bfloat16": {"enabled": True}}).enabled
    assert not get_bfloat16_config({}).enabled
    assert get_float16_config({"fp16": {"enabled": True, "loss_scale": 128}}).loss_scale == 128
    assert get_gradient_clipping({}) == GRADIENT_CLIPPING_DEFAULT == 1.0
    assert get_gradient_clipping({"gradient_clipping": 0.0}) == 0.0


def test_a_config_is_any_path_object_and_a_bad_one_is_a_value_error(tmp_path: Path) -> None:
    class PyPath:  # py.path.local's shape: a path only through __fspath__
        def __init__(self, p: Path) -> None:
            self.p = p

        def __fspath__(self) -> str:
            return str(self.p)

    (tmp_path / "ds.json").write_text('{"train_batch_size": 64}')
    cfg = DeepSpeedConfig(PyPath(tmp_path / "ds.json"))
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (64, 64, 1)
    (tmp_path / "dup.json").write_text('{"train_batch_size": 24, "train_batch_size": 24}')
    with pytest.raises(ValueError, match="duplicate key"):
        DeepSpeedConfig(str(tmp_path / "dup.json"))


def test_errors_cross_process_boundaries_whole() -> None:
    err = pickle.loads(pickle.dumps(ConfigError("ds.json", [Problem("lr", "must be a number")], hint="fix lr")))
    assert isinstance(err, ValueError) and err.problems[0].path == "lr" and err.hint == "fix lr"
    usage = pickle.loads(pickle.dumps(UsageError("bad flag", hint="see --help", usage="zerorun X")))
    assert (usage.message, usage.hint, usage.usage) == ("bad flag", "see --help", "zerorun X")


def test_initialize_without_a_model_is_deepspeed_s_assertion() -> None:
    import zerorun

    with pytest.raises(AssertionError, match="needs model="):
        zerorun.initialize(model=None, config={"train_batch_size": 1})
