"""`zerorun elastic`: the valid worlds and each one's batch, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerorun.cli import main


@pytest.fixture
def ds_json(tmp_path: Path) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"elasticity": {"enabled": True, "max_train_batch_size": 24,
                                               "micro_batch_sizes": [2, 4], "version": 0.1}}))
    return path


def test_lists_every_valid_world(ds_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["elastic", "--config", str(ds_json)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "train_batch_size 24; valid world sizes: 1, 2, 3, 4, 6, 12"
    assert out[3].split() == ["2", "4", "3"]


def test_one_world_as_json(ds_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["elastic", "--config", str(ds_json), "--world", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"] == [
        {"world": 4, "micro_batch": 2, "gradient_accumulation_steps": 3}]


def test_an_invalid_world_names_the_nearest(ds_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["elastic", "--config", str(ds_json), "--world", "5"]) == 1
    err = capsys.readouterr().err
    assert "world size 5 is not one of" in err and "hint: run at 4 or 6" in err and "Traceback" not in err
