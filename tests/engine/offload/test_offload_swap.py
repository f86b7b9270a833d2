"""Swap files (nvme offload): no numpy needed, and directories of SIGKILLed runs cleaned at the next start.

numpy is not a dependency, yet ``Tensor.numpy()`` used to carry every swap read and write
(``RuntimeError: Numpy is not available`` from a pool thread). The child below makes numpy
unimportable before torch is imported and trains with optimizer and parameter offload
to nvme, against the same run without offload.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from zerorun.engine.offload.swapper import LOCK, Swapper, _bytes, _read, _write

REPO = str(Path(__file__).resolve().parents[3])
ENV = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}

NO_NUMPY = f"""
import sys
sys.modules["numpy"] = None  # import numpy now raises ImportError, as in a clean environment
sys.path.insert(0, {REPO!r})
import json
import zerorun
from tests.engine.checkpoint.test_checkpoint_cases import Case, train
from tests.engine.test_engine_cases import make_model

def run(stage, offload):
    cfg = Case(stage).config(1)
    # the host step of offloaded masters is torch's fused kernel: the run without offload names it too,
    # so the two step with the same kernel and agree to the bit (foreach rounds otherwise)
    cfg["optimizer"]["params"]["fused"] = True
    for key, device in offload.items():
        cfg["zero_optimization"][key] = {{"device": device, "nvme_path": sys.argv[1], "buffer_count": 2}}
    engine, _, _, _ = zerorun.initialize(model=make_model(), config=cfg)
    losses = train(engine, 0, 1, 0, 3)
    if stage == 2:  # how far the parameters moved from their initial values
        start = dict(make_model().named_parameters())
        losses.append(sum(float((p.float() - start[n]).abs().sum()) for n, p in engine.module.named_parameters()))
    return losses

out = {{"numpy_importable": True}}
try:
    import numpy  # noqa: F401
except ImportError:
    out["numpy_importable"] = False
out["s2_none"], out["s2_nvme"] = run(2, {{}}), run(2, {{"offload_optimizer": "nvme"}})
out["s3_none"] = run(3, {{}})
out["s3_nvme"] = run(3, {{"offload_optimizer": "nvme", "offload_param": "nvme"}})
print(json.dumps(out), flush=True)
"""


def test_nvme_offload_trains_without_numpy(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", NO_NUMPY, str(tmp_path)], env=ENV, capture_output=True,
                           text=True, timeout=180)
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["numpy_importable"] is False
    assert out["s2_nvme"] == out["s2_none"] and out["s3_nvme"] == out["s3_none"]
    assert out["s2_nvme"][-1] > 1e-3  # and it does train: the parameters moved


def test_swap_bytes_round_trip_every_dtype(tmp_path: Path) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = (torch.arange(7) * 3 - 5).to(dtype)
        _write(tmp_path / "t", t[1:])  # a view with a storage offset
        assert torch.equal(_read(tmp_path / "t", 6, dtype), t[1:])
    assert _bytes(torch.empty(0)).nbytes == 0


SWAP_FOREVER = f"""
import sys
sys.path.insert(0, {REPO!r})
from pathlib import Path
import pytest
import torch
from zerorun.engine.offload.swapper import Swapper
s = Swapper(Path(sys.argv[1]), 2, 0)
t = torch.randn(1 << 16)
s.write("master", t).result()
print(s.dir, flush=True)
while True:  # swapping out and in, as an offloaded optimizer does every step
    s.write("master", t).result()
    t = s.read("master", t.numel(), t.dtype).result()
"""

HOLD = f"""
import sys
sys.path.insert(0, {REPO!r})
from pathlib import Path
from zerorun.engine.offload.swapper import Swapper
s = Swapper(Path(sys.argv[1]), 1, 0)
s.write("x", __import__("torch").ones(4)).result()
print(s.dir, flush=True)
sys.stdin.read()  # alive until the parent closes stdin
"""


def _start(code: str, root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, str(root)], env=ENV, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _swap_dir(child: subprocess.Popen[str]) -> Path:
    """The swap directory the child prints once it is running."""
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, child.communicate(timeout=30)[1]
    return Path(line.strip())


def test_a_sigkilled_runs_swap_files_are_removed_at_the_next_start_a_live_runs_kept(tmp_path: Path) -> None:
    killed, live = _start(SWAP_FOREVER, tmp_path), _start(HOLD, tmp_path)  # both start at once
    try:
        stale, alive = _swap_dir(killed), _swap_dir(live)
        time.sleep(0.2)  # mid-run: it is swapping
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert stale.is_dir() and any(stale.iterdir())  # SIGKILL skips every cleanup
        fresh = Swapper(tmp_path, 1, 0)
        assert fresh.stale_removed == [stale]
        assert not stale.exists() and not Path(str(stale) + LOCK).exists()
        assert (alive / "x").is_file() and Path(str(alive) + LOCK).is_file()  # the live run's files stay
        fresh.close()
        assert not fresh.dir.exists() and not Path(str(fresh.dir) + LOCK).exists()
    finally:
        live.communicate(input="", timeout=30)
        killed.kill()
    assert live.returncode == 0 and not alive.exists()  # a normal exit cleans its own


def test_swap_folders_are_0700_and_their_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)  # the most open umask: only the swapper's own modes stand between the weights and others
    try:
        s = Swapper(tmp_path, 1, 0)
        s.write("master", torch.ones(4)).result()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(s.dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((s.dir / "master").stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(str(s.dir) + LOCK).stat().st_mode) == 0o600
    finally:
        s.close()


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another user needs root")
def test_a_stale_looking_folder_of_another_user_is_left_alone(tmp_path: Path) -> None:
    from zerorun.engine.offload.swapper import PREFIX, _host, remove_stale

    theirs = tmp_path / f"{PREFIX}{_host()}-999999-0"
    theirs.mkdir()
    (theirs / "master").write_bytes(b"theirs")
    Path(str(theirs) + LOCK).touch()
    for p in (theirs, theirs / "master", Path(str(theirs) + LOCK)):
        os.chown(p, 65534, 65534)
    assert remove_stale(tmp_path) == []
    assert (theirs / "master").read_bytes() == b"theirs"
