"""Threads like torchrun: with OMP_NUM_THREADS unset each local rank gets its share of the
cores (at least 1), the launcher says so once, --threads_per_rank overrides, a user's
OMP_NUM_THREADS is kept. Before, every CPU rank started one thread per core (oversubscribed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import LaunchError
from launcher.plan.threads import threads_for, threads_per_rank_arg

PROBE = "import os\nprint('threads', os.environ.get('OMP_NUM_THREADS'))\n"
CORES = len(os.sched_getaffinity(0))


def test_rules() -> None:
    assert threads_for({}, None, 2, cores=16) == "8"
    assert threads_for({}, None, 4, cores=2) == "1"  # at least one
    assert threads_for({"OMP_NUM_THREADS": "3"}, None, 2, cores=16) is None  # the user's stays
    assert threads_for({"OMP_NUM_THREADS": "3"}, 5, 2, cores=16) == "5"  # the flag wins
    assert threads_for({}, None, 2, cores=16, bound_share=6) == "6"
    with pytest.raises(LaunchError, match="at least 1"):
        threads_per_rank_arg("0")


def _launch(tmp_path: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe.py").write_text(PROBE)
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto", *flags,
                           "probe.py"], cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_each_rank_gets_its_share_and_the_launcher_says_so_once(tmp_path: Path) -> None:
    out = _launch(tmp_path)
    assert out.returncode == 0, out.stderr
    share = str(max(1, CORES // 2))
    assert sorted(out.stdout.splitlines()) == [f"[localhost:0] threads {share}", f"[localhost:1] threads {share}"]
    assert sum("OMP_NUM_THREADS" in line for line in out.stderr.splitlines()) == 1, out.stderr
    assert f"OMP_NUM_THREADS={share} for each of the 2 ranks" in out.stderr and "--threads_per_rank" in out.stderr


def test_the_flag_and_the_users_variable(tmp_path: Path) -> None:
    out = _launch(tmp_path, "--threads_per_rank", "3", OMP_NUM_THREADS="5")
    assert out.returncode == 0 and out.stdout.count("threads 3") == 2, out.stdout + out.stderr
    out = _launch(tmp_path, OMP_NUM_THREADS="5")
    assert out.returncode == 0 and out.stdout.count("threads 5") == 2, out.stdout + out.stderr
    assert "OMP_NUM_THREADS=5 for every rank (from your environment)" in out.stderr
