"""A process SIGKILLed in the middle of ``save_checkpoint`` leaves the previous checkpoint intact.

The child (a plain world-of-one training script, a fresh process) saves tag ``good``,
trains on, and saves tag ``bad`` with the test-only pause hook set, which sleeps after
its rank file is durable and before the manifest and ``latest`` are written. The test
waits for that rank file to appear in the staging directory and kills the child there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from zerorun.engine.checkpoint import list_tags
from zerorun.engine.checkpoint.manifest import LATEST, rank_file
from zerorun.engine.checkpoint.save import PAUSE_ENV, staging_dir

CHILD = f"""
import os, sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
from tests.engine.checkpoint.test_checkpoint_cases import CASES, build, train
root = sys.argv[1]
engine = build(CASES[2], 1)
train(engine, 0, 1, 0, 2)
engine.save_checkpoint(root, tag="good")
torch.save({{n: p.detach().clone() for n, p in engine.module.named_parameters()}}, os.path.join(root, "good.params"))
train(engine, 0, 1, 2, 1)
os.environ[{PAUSE_ENV!r}] = "60"
print("saving bad", flush=True)
engine.save_checkpoint(root, tag="bad")
print("not killed", flush=True)
"""


def test_kill_mid_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    partial = staging_dir(tmp_path, "bad") / rank_file(0)
    try:
        deadline = time.monotonic() + 120
        while not partial.exists():
            assert child.poll() is None, f"child exited early:\n{child.stdout.read() if child.stdout else ''}"
            assert time.monotonic() < deadline, "the child never reached the save of tag 'bad'"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / LATEST).read_text() == "good"
    assert list_tags(tmp_path) == ["good"]
    assert not (tmp_path / "bad").exists()

    from tests.engine.checkpoint.test_checkpoint_cases import CASES, build

    engine = build(CASES[2], 1, seed=5)
    path, _ = engine.load_checkpoint(str(tmp_path))
    assert Path(path).name == "good"
    want = torch.load(tmp_path / "good.params")
    for n, p in engine.module.named_parameters():
        assert torch.equal(p, want[n]), n
    # a later save of the same tag clears the staging directory the crash left behind
    engine.save_checkpoint(str(tmp_path), tag="bad")
    assert list_tags(tmp_path) == ["good", "bad"] and (tmp_path / LATEST).read_text() == "bad"
    assert not staging_dir(tmp_path, "bad").exists()
