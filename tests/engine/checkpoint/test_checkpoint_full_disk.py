"""A disk that fills during a save, and temporary files a stranger could have planted.

A save that fails on a full disk (``RLIMIT_FSIZE`` in a child process: the write fails with
EFBIG as it would with ENOSPC) removes its ``.TAG.saving`` folder, ``latest`` still names
the old tag and the old checkpoint loads; the next save sweeps staging folders a crash
left. Every atomic write (checkpoint files, ``save_16bit_model``, a trial's result) goes
through a fresh ``mkstemp`` name: a symlink planted at the old guessable names receives
nothing, and a write that fails midway leaves no temporary file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.checkpoint.test_checkpoint_trust import _engine
from zerorun.engine.checkpoint import atomic
from zerorun.trial.protocol import write_json_atomic

REPO = Path(__file__).resolve().parents[3]

CHILD = r"""
import json, resource, signal, sys, torch
from tests.engine.checkpoint.test_checkpoint_trust import _engine
from zerorun.engine.checkpoint import CheckpointError
root = sys.argv[1]
engine = _engine()
engine.save_checkpoint(root, tag="t1")
want = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
ids = torch.arange(8) % 11
engine.backward(torch.nn.functional.cross_entropy(engine(ids), ids))
engine.step()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # the rank file is bigger: the disk is "full"
try:
    engine.save_checkpoint(root, tag="t2")
    error = None
except CheckpointError as e:
    error = str(e)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
fresh = _engine()
path, _ = fresh.load_checkpoint(root)
same = all(torch.equal(p, want[n]) for n, p in fresh.module.named_parameters())
print(json.dumps({"error": error, "loaded": path, "same": same}))
"""


def test_a_save_that_fills_the_disk_leaves_no_staging_folder_and_the_old_tag_loads(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["error"] is not None and "save failed while writing" in got["error"], got
    assert got["loaded"] == str(tmp_path / "t1") and got["same"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "t1", "zero_to_fp32.py"]
    assert (tmp_path / "latest").read_text() == "t1"


def test_the_next_save_sweeps_staging_folders_a_crash_left(tmp_path: Path) -> None:
    for name in (".t0.saving", ".other.saving"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank_00000.pt").write_bytes(b"x" * 1000)
    _engine().save_checkpoint(str(tmp_path), tag="t1")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".saving")]
    assert (tmp_path / "t1" / "manifest.json").is_file()


def _planted(folder: Path, name: str) -> tuple[Path, Path]:
    """Symlinks at every temporary name the old writers used for ``name``, all aimed at one victim file."""
    victim = folder.parent / f"victim-{name}"
    victim.write_text("untouched")
    for tmp in (f".{name}.tmp-{os.getpid()}", f"{name}.tmp", f".{name}.{os.getpid()}.tmp"):
        (folder / tmp).symlink_to(victim)
    return victim, folder / name


def test_atomic_writes_never_follow_a_planted_symlink(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    victim, target = _planted(folder, "rank_00000.pt")
    atomic.torch_save({"w": torch.ones(3)}, target)
    assert victim.read_text() == "untouched" and torch.equal(torch.load(target)["w"], torch.ones(3))
    victim, target = _planted(folder, "result.json")
    write_json_atomic(target, {"ok": 1})
    assert victim.read_text() == "untouched" and json.loads(target.read_text()) == {"ok": 1}
    victim, target = _planted(folder, "pytorch_model.bin")
    _engine().save_16bit_model(str(folder))
    assert victim.read_text() == "untouched" and "embed.weight" in torch.load(target)


def test_a_write_that_fails_midway_leaves_no_temporary_file_and_fsyncs_what_it_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    engine.save_16bit_model(str(tmp_path))
    before = (tmp_path / "pytorch_model.bin").read_bytes()

    def torn(obj: Any, f: Any) -> None:
        f.write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(OSError, match="No space left"):
        engine.save_16bit_model(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pytorch_model.bin"]
    assert (tmp_path / "pytorch_model.bin").read_bytes() == before
    monkeypatch.undo()
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    engine.save_16bit_model(str(tmp_path))
    assert len(synced) >= 2  # the file, then its folder's new entry
