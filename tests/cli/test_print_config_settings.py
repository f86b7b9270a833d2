"""`zerorun print-config` with settings flags writes a config: FILE, --template or the defaults, those keys set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zerorun.cli import main


def _written(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["print-config", *args]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_settings_on_the_defaults_write_a_config_that_validates(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds.yaml"
    assert main(["print-config", "--stage", "2", "--offload-optimizer", "cpu", "--masters", "bf16-kahan",
                 "--micro-batch", "2", "-o", str(out)]) == 0
    cfg = yaml.safe_load(out.read_text())
    assert cfg["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert cfg["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True,
                           "master_compensation": "kahan"}
    capsys.readouterr()
    assert main(["validate", str(out)]) == 0


def test_a_file_keeps_its_other_keys_and_none_drops_a_block(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "mine.json"
    src.write_text(json.dumps({"train_batch_size": 64, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "reduce_bucket_size": 1000, "offload_param": {"device": "cpu"}}}))
    cfg = _written(capsys, str(src), "--offload-param", "none", "--micro-batch", "1")
    assert cfg["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1000}
    assert "train_batch_size" not in cfg and cfg["train_micro_batch_size_per_gpu"] == 1


def test_a_template_moved_from_nvme_to_cpu_loses_its_nvme_path(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _written(capsys, "--template", "zero3-offload-nvme", "--offload-optimizer", "cpu")
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "nvme_path" not in cfg["zero_optimization"]["offload_optimizer"]
    assert cfg["zero_optimization"]["offload_param"]["device"] == "nvme"
