"""zerorun/config reading: JSON, YAML, dicts; duplicate keys; malformed files with line and column."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from zerorun.config import ConfigError, load_config


def error_lines(source: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(source)  # type: ignore[arg-type]
    return [p.render(caught.value.origin) for p in caught.value.problems]


def test_json_and_yaml_load_the_same(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}')
    (tmp_path / "a.yaml").write_text("zero_optimization:\n  stage: 2\n  reduce_bucket_size: 5e8\n")
    from_json, from_yaml = load_config(tmp_path / "a.json"), load_config(str(tmp_path / "a.yaml"))
    assert from_json == from_yaml
    assert from_yaml.zero_optimization.reduce_bucket_size == 500_000_000


def test_yaml_scientific_without_dot_is_a_number(tmp_path: Path) -> None:
    # PyYAML alone reads 5e8 as the string "5e8"; DeepSpeed users mean the number.
    (tmp_path / "s.yaml").write_text("zero_optimization:\n  allgather_bucket_size: 2e8\n  reduce_bucket_size: 1.5e+8\n")
    zero = load_config(tmp_path / "s.yaml").zero_optimization
    assert (zero.allgather_bucket_size, zero.reduce_bucket_size) == (200_000_000, 150_000_000)


def test_yaml_fraction_for_a_count_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "f.yaml").write_text("zero_optimization:\n  reduce_bucket_size: 2.5e-1\n")
    assert error_lines(tmp_path / "f.yaml") == [
        f"{tmp_path / 'f.yaml'}: zero_optimization.reduce_bucket_size: expected an integer, got 0.25, which has a fractional part"
    ]


def test_duplicate_json_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('{\n  "zero_optimization": {\n    "stage": 1,\n    "stage": 3\n  }\n}\n')
    assert error_lines(path) == [f"{path}: duplicate key 'stage' (line 4); the later value would silently win"]


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("fp16:\n  enabled: true\nfp16:\n  enabled: false\n")
    assert error_lines(path) == [f"{path}: duplicate key 'fp16' (line 3); the later value would silently win"]


def test_malformed_json_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{\n  "train_batch_size": 8\n  "fp16": {}}\n}\n')  # neither JSON nor Hjson
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [p.render(str(path)) for p in caught.value.problems] == [
        f"{path}: malformed JSON at line 3, column 3: Expecting ',' delimiter"
    ]
    assert caught.value.hint == "fix the JSON syntax at line 3, column 3"


def test_a_json_file_in_hjson_loads_as_deepspeed_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"  # what hjson.dump writes: unquoted keys and strings, no commas
    path.write_text("{\n  train_batch_size: 8\n  optimizer:\n  {\n    type: Adam\n    params: {lr: 0.001}\n  }\n}\n")
    cfg = load_config(path, world_size=1)
    assert (cfg.train_batch_size, cfg.optimizer.type, cfg.optimizer.params["lr"]) == (8, "Adam", 0.001)
    path.write_text("{\n  train_batch_size: 8\n  train_batch_size: 4\n}\n")
    with pytest.raises(ConfigError, match="duplicate key 'train_batch_size'"):
        load_config(path, world_size=1)


def test_malformed_yaml_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("zero_optimization:\n  stage: [2\n  overlap_comm: true\n")
    (line,) = error_lines(path)
    assert line.startswith(f"{path}: malformed YAML at line 3, column 15:")


def test_missing_file_and_wrong_top_level(tmp_path: Path) -> None:
    assert error_lines(tmp_path / "nope.json") == [f"{tmp_path / 'nope.json'}: no such file"]
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    assert error_lines(tmp_path / "list.yaml") == [f"{tmp_path / 'list.yaml'}: the top level must be a mapping of keys, got list"]
    assert error_lines(42) == ["<config>: expected a path or a dict, got int"]


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_text("# nothing\n")
    assert load_config(tmp_path / "e.yaml") == load_config(None)


def test_dict_source_is_not_mutated() -> None:
    source = {"zero_optimization": {"stage": 3, "cpu_offload": True, "reduce_bucket_size": "auto"}, "train_batch_size": "auto"}
    before = copy.deepcopy(source)
    with pytest.warns(UserWarning):
        load_config(source, world_size=2, hidden_size=64)
    assert source == before



def test_enum_members_in_a_dict_config_read_as_their_values() -> None:
    """DeepSpeed's tests and scripts write ``{"device": OffloadDeviceEnum.cpu}``; its config models read the value."""
    from zerorun.compat.offload_config import OffloadDeviceEnum

    source = {"train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": OffloadDeviceEnum.cpu}}}
    cfg = load_config(source, world_size=1)
    assert cfg.zero_optimization.offload_optimizer.device == "cpu"
    assert source["zero_optimization"]["offload_optimizer"]["device"] is OffloadDeviceEnum.cpu  # not mutated


def test_dotted_top_level_keys_are_ignored_with_a_warning() -> None:
    """TRL's prepare_deepspeed writes literal dotted keys; DeepSpeed ignores them, and so does zerorun."""
    from zerorun.config import load_config
    from zerorun.config.problems import ConfigWarning

    raw = {"zero_optimization": {"stage": 3}, "zero_optimization.reduce_bucket_size": 64,
           "zero_optimization.stage3_param_persistence_threshold": 320}
    with pytest.warns(ConfigWarning, match=r"zero_optimization\.reduce_bucket_size: a dotted top-level key is "
                                           r"ignored.*inside the `zero_optimization` block"):
        cfg = load_config(raw, world_size=2)
    assert cfg.zero_optimization.reduce_bucket_size != 64
    assert cfg.zero_optimization.stage3_param_persistence_threshold != 320
