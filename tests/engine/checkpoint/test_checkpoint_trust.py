"""A stranger's checkpoint runs no code: every file loads as data; `latest` and tags stay in the save dir.

A hostile file carries a pickled call (``os.system("touch MARKER")``). Loading it through
``load_checkpoint``, ``zerorun convert`` and the ``zero_to_fp32`` entry points must refuse it
with an error that names the file and the global, and leave no marker; with the opt-in
(``trust_checkpoint=True`` / ``--trust``) the user's vouched-for file loads as before. The
same holds for DeepSpeed's format (a copy of a fixture with the call planted in it), and
a plain-data ``client_state`` needs no opt-in while one of the script's own classes does.
"""

from __future__ import annotations

import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.engine.checkpoint.test_convert import TiedNet
from zerorun.cli import main
from zerorun.engine.checkpoint import CheckpointError, ds_files, zero_to_fp32
from zerorun.engine.checkpoint.manifest import rank_file

DS_FIXTURES = Path(__file__).parents[2] / "fixtures" / "ds_checkpoints"


class Plant:
    """Pickles as a call of ``os.system``: what a hostile checkpoint carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


class Mine:
    """A script's own class in client_state: not data, so loading it needs the opt-in."""

    def __init__(self, value: int) -> None:
        self.value = value


def _engine() -> Any:
    import zerorun

    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2}}
    engine, _, _, _ = zerorun.initialize(model=TiedNet(), config=cfg)
    return engine


@pytest.fixture(scope="module")
def engine() -> Any:
    engine = _engine()
    ids = torch.arange(8) % 11
    engine.backward(nn.functional.cross_entropy(engine(ids), ids))
    engine.step()
    return engine


@pytest.fixture(scope="module")
def saved(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    engine.save_checkpoint(str(root), tag="t1", client_state={"step": 1, "note": "plain"})
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _plant(file: Path, marker: Path) -> None:
    torch.save({**torch.load(file, weights_only=True), "evil": Plant(marker)}, file)


def _plant_deepspeed(file: Path, marker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-save a DeepSpeed file with the call added: its stand-ins pickle under DeepSpeed's names again,
    which needs those modules importable while it is written."""
    for qualified, cls in ds_files.STAND_INS.items():
        parts = qualified.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            module = sys.modules.get(name) if name in sys.modules else types.ModuleType(name)
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.setattr(sys.modules[".".join(parts)], cls.__name__, cls, raising=False)
    payload = ds_files.load(file)
    payload["evil"] = Plant(marker)
    torch.save(payload, file)


def test_plain_client_state_loads_without_opt_in(engine: Any, saved: Path) -> None:
    path, client = engine.load_checkpoint(str(saved))
    assert Path(path).name == "t1" and client == {"step": 1, "note": "plain"}
    assert (saved / "t1" / "client_state_00000.pt").is_file()  # a file of its own, beside the rank file


def test_a_hostile_rank_file_is_refused_everywhere_and_runs_nothing(engine: Any, saved: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = _copy(saved, tmp_path / "ckpt")
    marker = tmp_path / "MARKER"
    _plant(root / "t1" / rank_file(0), marker)
    with pytest.raises(CheckpointError) as err:
        engine.load_checkpoint(str(root))
    assert str(root / "t1" / rank_file(0)) in err.value.message and "posix.system" in err.value.message
    assert "trust_checkpoint=True" in str(err.value)
    assert main(["convert", str(root), str(tmp_path / "m.pt")]) == 1
    out = capsys.readouterr().err
    assert "posix.system" in out and rank_file(0) in out and "Traceback" not in out
    with pytest.raises(ValueError, match="posix.system"):  # the script in every save dir, without zerorun
        zero_to_fp32.state_dict_of_tag(root / "t1")
    assert not marker.exists() and not (tmp_path / "m.pt").exists()
    assert main(["convert", str(root), str(tmp_path / "m.pt"), "--trust"]) == 0  # the opt-in: as torch.load
    assert marker.exists()


def test_client_state_of_the_scripts_own_classes_needs_the_opt_in(engine: Any, tmp_path: Path) -> None:
    engine.save_checkpoint(str(tmp_path), tag="own", client_state={"mine": Mine(7)})
    with pytest.raises(CheckpointError, match=r"client_state_00000\.pt.*test_checkpoint_trust\.Mine"):
        engine.load_checkpoint(str(tmp_path))
    assert main(["convert", str(tmp_path), str(tmp_path / "m.pt")]) == 0  # the weights never needed it
    _, client = engine.load_checkpoint(str(tmp_path), trust_checkpoint=True)
    assert client["mine"].value == 7


@pytest.mark.parametrize("planted", ["mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"])
def test_a_hostile_deepspeed_file_is_refused_and_runs_nothing(engine: Any, tmp_path: Path, planted: str,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy(DS_FIXTURES / "stage2_fp32", tmp_path / "ds")
    marker = tmp_path / "MARKER"
    with monkeypatch.context() as patch:
        _plant_deepspeed(root / "global_step2" / planted, marker, patch)
    with pytest.raises(CheckpointError) as err:
        engine.load_checkpoint(str(root))
    assert planted in err.value.message and "posix.system" in err.value.message
    assert main(["convert", str(root), str(tmp_path / "m.pt")]) == 1
    assert "posix.system" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="posix.system"):
        zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root)
    assert not marker.exists()


def test_deepspeed_fixtures_load_as_data_with_their_classes_as_inert_stand_ins() -> None:
    for case in sorted(DS_FIXTURES.iterdir()):
        if not case.is_dir():
            continue
        tag = case / (case / "latest").read_text().strip()
        for file in sorted(tag.glob("*.pt")):
            payload = ds_files.load(file)  # no opt-in
            scaler = payload.get("optimizer_state_dict", {}).get("loss_scaler")
            if scaler is not None:
                assert type(scaler).__module__ == "deepspeed.runtime.fp16.loss_scaler"
                assert isinstance(scaler, ds_files.DeepSpeedObject) and "cur_scale" in scaler.state


def _outside(tmp_path: Path, saved: Path) -> tuple[Path, Path]:
    """A save dir whose `latest` points out of it, at a complete checkpoint elsewhere."""
    _copy(saved, tmp_path / "outside")
    (tmp_path / "outside" / "t1").rename(tmp_path / "outside" / "t9")
    root = tmp_path / "mine"
    root.mkdir()
    (root / "latest").write_text("../outside/t9")
    return root, tmp_path / "outside" / "t9"


def test_latest_and_tags_resolve_inside_the_save_dir(engine: Any, saved: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    root, elsewhere = _outside(tmp_path, saved)
    with pytest.raises(CheckpointError, match=r"'\.\./outside/t9' is not a directory name inside"):
        engine.load_checkpoint(str(root))
    with pytest.raises(CheckpointError, match="is not a directory name inside"):
        engine.load_checkpoint(str(root), tag="../outside/t9")
    with pytest.raises(ValueError, match="is not a directory name inside"):
        zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root)
    assert main(["convert", str(root), str(tmp_path / "m.pt")]) == 1
    assert "is not a directory name inside" in capsys.readouterr().err
    (root / "latest").write_text("t9")
    (root / "t9").symlink_to(elsewhere)  # a tag linked out of the save dir leaves it just the same
    with pytest.raises(CheckpointError, match="'t9' is not a directory name inside"):
        engine.load_checkpoint(str(root))
    with pytest.raises(ValueError, match="is not a directory name inside"):
        zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(root)


def test_the_saved_rng_states_are_plain_data_and_restore_numpy(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    from zerorun.engine.checkpoint import state

    np.random.seed(5)
    torch.save(state.capture_rng(), tmp_path / "rng.pt")
    want = np.random.rand(3)
    np.random.seed(6)
    state.restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))  # loads as data: no ndarray in it
    assert np.array_equal(np.random.rand(3), want)


def test_numpy_values_load_as_data_as_older_checkpoints_hold_them(tmp_path: Path) -> None:
    """Checkpoints saved before the RNG states became lists hold numpy's state as an ndarray; a client_state
    may hold numpy scalars. Both are numbers: they load without the opt-in, through both readers."""
    np = pytest.importorskip("numpy")
    from zerorun.engine.checkpoint import safe_load

    payload = {"rng": np.random.get_state(), "best": np.float64(0.25), "ids": np.arange(3, dtype=np.int32)}
    torch.save(payload, tmp_path / "old.pt")
    for loaded in (safe_load.load(tmp_path / "old.pt"), zero_to_fp32.load_data(tmp_path / "old.pt")):
        assert np.array_equal(loaded["rng"][1], payload["rng"][1]) and loaded["best"] == 0.25
        assert loaded["ids"].tolist() == [0, 1, 2]
