"""Real-world-shaped configs (tests/configs, templates/) validate; mutated copies fail naming the key."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from zerorun.config import ConfigError, inspect_config, load_config

CONFIGS = Path(__file__).parents[1] / "configs"
TEMPLATES = Path(__file__).parents[2] / "templates"
EXAMPLES = sorted(CONFIGS.glob("*.json")) + sorted(CONFIGS.glob("*.yaml"))
TEMPLATE_FILES = sorted(TEMPLATES.glob("*.yaml"))


def test_the_fixtures_and_templates_exist() -> None:
    assert len(EXAMPLES) >= 7
    assert {p.stem for p in TEMPLATE_FILES} == {
        "zero0", "zero1", "zero2", "zero3", "zero2-offload-cpu", "zero3-offload-cpu", "zero3-offload-nvme"
    }  # fmt: skip


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_configs_validate(path: Path) -> None:
    loaded = inspect_config(path, world_size=8, hidden_size=1024)
    cfg = loaded.config
    assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * 8


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_templates_validate_at_any_world_size(path: Path, world_size: int) -> None:
    loaded = inspect_config(path, world_size=world_size)
    cfg = loaded.config
    assert loaded.warnings == ()
    assert cfg.optimizer is not None and cfg.optimizer.type == "AdamW"
    assert str(loaded.provenance["train_batch_size"]).startswith("derived")
    assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * world_size


def test_templates_match_their_names() -> None:
    stage = {p.stem: load_config(p).zero_optimization for p in TEMPLATE_FILES}
    assert [stage[f"zero{n}"].stage for n in range(4)] == [0, 1, 2, 3]
    assert stage["zero2-offload-cpu"].offload_optimizer.device == "cpu" and stage["zero2-offload-cpu"].stage == 2
    assert stage["zero3-offload-cpu"].offload_param.device == "cpu"
    nvme = stage["zero3-offload-nvme"]
    assert nvme.offload_param.device == nvme.offload_optimizer.device == "nvme" and nvme.offload_param.nvme_path


def test_infinity_config_keeps_its_aio_block() -> None:
    cfg = load_config(CONFIGS / "infinity_nvme.json", world_size=8)
    assert (cfg.aio.block_size, cfg.aio.queue_depth) == (262144, 32)
    assert cfg.zero_optimization.offload_param.buffer_size == 100_000_000
    assert cfg.gradient_accumulation_steps == 2


def _mutate(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


MUTATIONS = [
    ("hf_zero3.json", "zero_optimization.stage", 5, "zero_optimization.stage: 5 is not one of 0, 1, 2, 3"),
    ("hf_zero3.json", "zero_optimization.stage3_prefetch_bucket_size", 15099494.4, "zero_optimization.stage3_prefetch_bucket_size: expected an integer"),
    ("hf_zero2.json", "zero_optimization.offload_optimizer.device", "disk", 'zero_optimization.offload_optimizer.device: "disk" is not one of none, cpu, nvme'),
    ("hf_zero2.json", "zero_optimization.reduce_bucket_sizes", 1e8, "zero_optimization.reduce_bucket_sizes: unknown key (did you mean zero_optimization.reduce_bucket_size?)"),
    ("infinity_nvme.json", "zero_optimization.offload_param.nvme_path", None, "zero_optimization.offload_param.nvme_path: zero_optimization.offload_param.device is nvme but nvme_path is not set"),
    ("infinity_nvme.json", "aio.queue_dept", 8, "aio.queue_dept: unknown key (did you mean aio.queue_depth?)"),
    ("infinity_nvme.json", "bf16.enabled", True, "fp16.enabled: fp16 and bf16 are both enabled"),
    ("stage1_floats.json", "train_batch_size", 30, "train_batch_size: train_batch_size (30) is not divisible by"),
    ("stage2_floats.json", "gradient_acumulation_steps", 4, "gradient_acumulation_steps: unknown key (did you mean gradient_accumulation_steps?)"),
]


@pytest.mark.parametrize(("name", "path", "value", "expected"), MUTATIONS, ids=[m[1] for m in MUTATIONS])
def test_mutated_examples_fail_naming_the_key(name: str, path: str, value: Any, expected: str) -> None:
    data = json.loads((CONFIGS / name).read_text())
    with pytest.raises(ConfigError) as caught:
        load_config(_mutate(data, path, value), world_size=8, hidden_size=1024)
    lines = [problem.render("<dict>") for problem in caught.value.problems]
    assert any(line.startswith(f"<dict>: {expected}") for line in lines), lines
