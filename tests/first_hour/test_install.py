"""The README's first command, for real: scripts/setup.sh into a fresh virtual environment
(no system site-packages, so nothing of the test set-up can leak in), with `apt-get` and
`sudo` replaced by tripwires, then the README's main job from that environment.

Before, the main job's set-up was the test set-up (apt packages, root, the dev extras).
This costs a venv and torch's install from the local wheel (pip's byte-compiling skipped,
as setup.sh does), plus a short run; the README's transcript is checked on the same run.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_JOB = "zerorun --num_gpus 2 examples/train_toy.py --config templates/zero2.yaml"


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(# the main job.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README's quick start lost its bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


@pytest.mark.timeout(400)
def test_first_install_command_runs_the_main_job_from_a_clean_venv(tmp_path: Path) -> None:
    first = _readme_commands()[0]
    assert first == f"bash scripts/setup.sh && .venv/bin/{README_JOB}", first
    trip = tmp_path / "trip"
    trip.mkdir()
    for tool in ("apt-get", "apt", "sudo", "dpkg"):
        (trip / tool).write_text(f"#!/bin/sh\necho {tool} >> {tmp_path}/tripped\nexit 99\n")
        (trip / tool).chmod(0o755)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=f"{trip}:/usr/local/bin:/usr/bin:/bin", ZERORUN_VENV=str(venv), PIP_NO_CACHE_DIR="0")
    setup = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=360)
    assert setup.returncode == 0, setup.stdout + setup.stderr[-3000:]
    assert not (tmp_path / "tripped").exists(), (tmp_path / "tripped").read_text()
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    py = str(venv / "bin" / "python")
    extras = subprocess.run([py, "-c", "import importlib.util as u; print([m for m in "
                             "('pytest', 'transformers', 'ruff', 'trl') if u.find_spec(m)])"],
                            capture_output=True, text=True, env=env)
    assert extras.stdout.strip() == "[]", extras.stdout  # the main job's set-up holds no dev extras
    job = subprocess.run([str(venv / "bin" / "zerorun"), *README_JOB.split()[1:], "--steps", "6", "--print-every", "3"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    transcript = job.stdout + job.stderr
    assert job.returncode == 0, transcript
    lines = transcript.splitlines()
    assert "[localhost:0] step   6  mean loss" in transcript and "Traceback" not in transcript
    assert "zerorun: run summary: 2 rank(s) on 1 node(s)" in transcript and "6 step(s), exit code 0" in transcript
    assert sum("OMP_NUM_THREADS" in line for line in lines) == 1, transcript  # said once
    assert len(lines) < 25, transcript
