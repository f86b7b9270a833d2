"""YAML configs (``zerorun/config/yaml_load.py``): merge keys work, self-referencing anchors and alias
bombs are config errors with a line, deep nesting too; never a traceback, through ``zerorun validate`` too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.config.test_config_load import error_lines
from zerorun.cli import main
from zerorun.config import load_config
from zerorun.config.yaml_load import MAX_DEPTH, MAX_NODES


def _bomb(levels: int = 7, width: int = 9) -> str:
    """A "billion laughs": each level lists the previous one ``width`` times (9**7: 4.8 million strings)."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_merge_keys_apply_and_the_keys_beside_them_win(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("zero_optimization:\n  stage: 3\n  overlap_comm: true\n"
                    "  offload_optimizer: &cpu {device: cpu, pin_memory: true}\n"
                    "  offload_param:\n    <<: *cpu\n    pin_memory: false\n")
    zero = load_config(path).zero_optimization
    assert zero.stage == 3 and zero.overlap_comm is True
    assert zero.offload_param.device == "cpu" and zero.offload_param.pin_memory is False
    path.write_text("a: &a {stage: 1}\nb: &b {overlap_comm: true}\nzero_optimization:\n  <<: [*a, *b]\n  stage: 3\n"
                    "  stage: 2\n")
    assert error_lines(path) == [f"{path}: duplicate key 'stage' (line 6); the later value would silently win"]


@pytest.mark.parametrize("text,line", [("zero_optimization: &x {stage: 2, extra: *x}\n", 1),
                                       ("fp16:\n  enabled: true\nlist: &l [1, [2, *l]]\n", 3)])
def test_an_anchor_used_inside_itself_is_an_error_naming_it(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "self.yaml"
    path.write_text(text)
    [message] = error_lines(path)
    assert f"(line {line}) is used inside itself" in message and "&" in message


def test_an_alias_bomb_is_refused_quickly_before_it_is_expanded(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    assert len(path.read_bytes()) < 600
    start = time.perf_counter()
    [message] = error_lines(path)
    assert f"more than {MAX_NODES:,} values" in message and time.perf_counter() - start < 2.0
    path.write_text(_bomb(levels=3))  # 729 values through aliases: fine
    with pytest.raises(Exception, match="a0"):  # gets as far as validation: unknown keys, not the reader
        load_config(path)


def test_nesting_too_deep_is_an_error_in_either_format(tmp_path: Path) -> None:
    text = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"
    (tmp_path / "deep.json").write_text(text)
    assert error_lines(tmp_path / "deep.json") == [f"{tmp_path / 'deep.json'}: the JSON nests too deeply to read"]
    (tmp_path / "deep.yaml").write_text("a:\n" + "".join(f"{'  ' * i}- \n" for i in range(1, 300)))  # block style
    start = time.perf_counter()
    assert error_lines(tmp_path / "deep.yaml") == [f"{tmp_path / 'deep.yaml'}: the YAML nests deeper than "
                                                   f"{MAX_DEPTH} levels (line {MAX_DEPTH + 1})"]
    assert time.perf_counter() - start < 1.0


def test_validate_shows_each_case_as_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, text in (("self.yaml", "a: &x [*x]\n"), ("bomb.yaml", _bomb())):
        (tmp_path / name).write_text(text)
        assert main(["validate", str(tmp_path / name)]) == 1
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and "Traceback" not in out + err
        assert "used inside itself" in out if name == "self.yaml" else f"more than {MAX_NODES:,} values" in out
