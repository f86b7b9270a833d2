"""DeepSpeed's smaller modules: op-builder probes, the offload enums, comm.config, top-level DeepSpeedConfig."""

from __future__ import annotations

import pytest

from zerorun.compat import op_builder
from zerorun.compat.comm_config import CommsLoggerConfig, DeepSpeedCommsConfig
from zerorun.compat.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum
from zerorun.compat.surface import DeepSpeedConfig
from zerorun.errors import UnsupportedFeature


def test_every_op_builder_probe_answers_false_and_building_names_the_feature(capsys: pytest.CaptureFixture) -> None:
    for name in op_builder.BUILDER_NAMES:
        builder = getattr(op_builder, name)()
        assert builder.is_compatible() is False and "builds no DeepSpeed" in builder.error_log
    assert op_builder.__getattr__("NewerBuilder")().is_compatible(verbose=True) is False
    assert "newer: zerorun builds no" in capsys.readouterr().err
    assert set(op_builder.ALL_OPS) >= {"cpuadam", "asyncio", "fusedadam"}
    for verb in ("load", "jit_load", "builder"):
        with pytest.raises(UnsupportedFeature, match=rf"CPUAdamBuilder\(\)\.{verb}\(\)"):
            getattr(op_builder.CPUAdamBuilder(), verb)()
    with pytest.raises(AttributeError):
        op_builder.__getattr__("not_a_builder")


def test_offload_enums_have_deepspeeds_values() -> None:
    assert [e.value for e in OffloadDeviceEnum] == ["none", "cpu", "nvme"]
    assert OffloadDeviceEnum("cpu") == "cpu"
    assert [e.value for e in OffloadStateTypeEnum] == ["optim_states", "hp_params", "lp_params", "lp_grads",
                                                        "contiguous_grad_buffer"]


def test_comms_config_parses_as_deepspeed() -> None:
    assert DeepSpeedCommsConfig({}).comms_logger_enabled is False
    parsed = DeepSpeedCommsConfig({"comms_logger": {"enabled": True, "prof_ops": ["all_reduce"]}})
    assert parsed.comms_logger == CommsLoggerConfig(enabled=True, prof_all=True, prof_ops=["all_reduce"])


def test_top_level_deepspeed_config_reads_the_batch_arithmetic() -> None:
    cfg = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
                           "zero_optimization": {"stage": 2}})
    assert (cfg.train_batch_size, cfg.zero_optimization_stage, cfg.zero_enabled) == (6, 2, True)
