"""Decoupled saves (``checkpoint.writer.decoupled``): the snapshot is the state at the save, never torn.

- world 2, stages 2 and 3: a save, three more steps while the writer writes, a second
  save; fresh engines load the first tag to the exact parameters at that save, and a
  resume from it is bit-identical to the straight run (the optimizer state was snapshot too);
  ``latest`` names the second tag;
- a process killed while its writer is between the rank file and the commit keeps the
  previous tag and ``latest``; a process that exits normally commits its last save first;
- a failed background write is raised at the next save, ``latest`` untouched;
- the writer holds at most ``slots`` jobs; ``type: mock`` writes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.child_output import next_own_line
from tests.dist_harness import run_distributed
from tests.engine.checkpoint.test_checkpoint_cases import CASES, HALF, STEPS, snapshot, train
from zerorun.engine.checkpoint import CheckpointError, list_tags
from zerorun.engine.checkpoint.manifest import LATEST, rank_file
from zerorun.engine.checkpoint.save import PAUSE_ENV, staging_dir
from zerorun.engine.checkpoint.writer import BackgroundWriter

REPO = Path(__file__).resolve().parents[3]
WRITER = {"decoupled": True, "io_buffer_size": 4096}
CASES_HERE = (CASES[3],)  # stage 3: sharded parameters, gathered frozen ones; each stage saves the same way


def build(case: Any, world: int, seed: int = 1234, writer: dict | None = None) -> Any:
    import zerorun
    from tests.engine.test_engine_cases import make_model

    cfg = case.config(world)
    cfg["checkpoint"] = {"writer": dict(WRITER if writer is None else writer)}
    engine, _, _, _ = zerorun.initialize(model=make_model(seed), config=cfg)
    return engine


def _rank(rank: int, world: int, root: str) -> dict[str, Any]:
    out = {}
    for case in CASES_HERE:
        d = str(Path(root) / case.name)
        engine = build(case, world)
        train(engine, rank, world, 0, HALF)
        engine.save_checkpoint(d, tag="half", client_state={"rank": rank})
        half = snapshot(engine)
        train(engine, rank, world, HALF, STEPS - HALF)  # the writer is (likely) still writing meanwhile
        engine.save_checkpoint(d, tag="end")
        straight = snapshot(engine)
        resumed = build(case, world, seed=99)
        _, client = resumed.load_checkpoint(d, tag="half")
        at_load = snapshot(resumed)
        train(resumed, rank, world, HALF, STEPS - HALF)
        latest = build(case, world, seed=98)
        path, _ = latest.load_checkpoint(d)
        out[case.name] = {"half": half, "straight": straight, "at_load": at_load, "resumed": snapshot(resumed),
                          "client": client, "latest": Path(path).name, "from_latest": snapshot(latest)}
    return out


def test_decoupled_saves_hold_the_state_at_the_save(tmp_path: Path) -> None:
    results = run_distributed(_rank, 2, str(tmp_path), timeout=240)
    for rank, per_case in enumerate(results):
        for name, r in per_case.items():
            for n, p in r["half"]["params"].items():
                assert torch.equal(r["at_load"]["params"][n], p), (rank, name, n)
            for n, p in r["straight"]["params"].items():
                assert torch.equal(r["resumed"]["params"][n], p), (rank, name, n, "resume")
                assert torch.equal(r["from_latest"]["params"][n], p), (rank, name, n, "latest")
            assert r["client"] == {"rank": rank} and r["latest"] == "end"
    for case in CASES_HERE:
        assert not list(tmp_path.glob(f"{case.name}/.*.saving"))


CHILD = f"""
import os, sys, torch
sys.path.insert(0, {str(REPO)!r})
from tests.engine.checkpoint.test_checkpoint_cases import CASES, train
from tests.engine.checkpoint.test_checkpoint_decoupled import build
from zerorun.engine.checkpoint.decoupled import settle
root, mode = sys.argv[1], sys.argv[2]
engine = build(CASES[2], 1)
train(engine, 0, 1, 0, 2)
engine.save_checkpoint(root, tag="good")
settle(engine)  # "good" committed before the pause is armed: the writer reads it after each job's rank file
train(engine, 0, 1, 2, 1)
os.environ[{PAUSE_ENV!r}] = "60" if mode == "kill" else "1"
engine.save_checkpoint(root, tag="next")
torch.save({{n: p.detach().clone() for n, p in engine.module.named_parameters()}}, os.path.join(root, "next.params"))
print("save returned", flush=True)
if mode == "kill":
    train(engine, 0, 1, 3, 1000)  # killed meanwhile
"""


def _child(root: Path, mode: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(root), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kill_while_the_writer_writes_keeps_the_previous_tag(tmp_path: Path) -> None:
    child = _child(tmp_path, "kill")
    partial = staging_dir(tmp_path, "next") / rank_file(0)
    try:
        assert child.stdout is not None
        assert next_own_line(child.stdout) == "save returned"  # training goes on while the writer writes
        deadline = time.monotonic() + 240  # the rank file is fsynced: slow when the disk is busy
        while not partial.exists():  # the writer sits between the durable rank file and the commit
            assert time.monotonic() < deadline, "the writer never wrote its rank file"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / LATEST).read_text() == "good" and list_tags(tmp_path) == ["good"]


def test_process_exit_waits_for_the_last_write(tmp_path: Path) -> None:
    child = _child(tmp_path, "exit")
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    assert (tmp_path / LATEST).read_text() == "next" and list_tags(tmp_path) == ["good", "next"]
    from zerorun.engine.checkpoint import consolidate

    want = torch.load(tmp_path / "next.params")
    got = consolidate(tmp_path)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_a_failed_background_write_is_raised_at_the_next_save(tmp_path: Path, monkeypatch: Any) -> None:
    from zerorun.engine.checkpoint import decoupled

    engine = build(CASES[2], 1, writer={**WRITER, "io_buffer_double": False})  # a save waits for the last
    train(engine, 0, 1, 0, 1)
    engine.save_checkpoint(str(tmp_path), tag="good")
    decoupled.settle(engine)  # written and committed

    def full_disk(*_: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(decoupled, "_torch_save", full_disk)
    engine.save_checkpoint(str(tmp_path), tag="bad")  # returns: the write fails in the background
    with pytest.raises(CheckpointError, match="No space left"):
        engine.save_checkpoint(str(tmp_path), tag="later")
    assert (tmp_path / LATEST).read_text() == "good" and list_tags(tmp_path) == ["good"]
    assert not staging_dir(tmp_path, "bad").exists()
    decoupled.flush_writes(engine)


def test_mock_writer_writes_nothing(tmp_path: Path) -> None:
    engine = build(CASES[2], 1, writer={"type": "mock"})
    with pytest.warns(UserWarning, match="writes nothing"):
        engine.save_checkpoint(str(tmp_path / "ck"), tag="t")
    assert not (tmp_path / "ck").exists()


def test_writer_holds_at_most_its_slots() -> None:
    writer = BackgroundWriter(slots=2)
    gate, order, seen = threading.Event(), [], []

    def job(i: int) -> Any:
        def run() -> None:
            gate.wait(10)
            order.append(i)
            if i == 1:
                raise OSError("boom")
        return run

    writer.submit("a", job(0))
    writer.submit("b", job(1))
    third = threading.Thread(target=lambda: (writer.submit("c", job(2)), seen.append(len(order))))
    third.start()
    time.sleep(0.2)
    assert not seen and writer.pending_keys() == ["a", "b"]  # a third snapshot waits for a free slot
    gate.set()
    third.join(10)
    assert seen and seen[0] >= 1
    errors = writer.close()
    assert order == [0, 1, 2] and [str(e) for e in errors] == ["boom"]
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit("d", job(3))
