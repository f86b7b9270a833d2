"""The README's first command, for real: scripts/setup.sh into a fresh virtual environment
(no system site-packages, so nothing of the test set-up can leak in), with `apt-get` and
`sudo` replaced by tripwires, then the README's main job from that environment.

Before, the main job's set-up was the test set-up (apt packages, root, the dev extras).

Unpacking torch's wheel is the costliest step (48.5 s at load average 14 on a 2-core
machine; pip finds a linked torch in 4 s), so by default the clean venv is handed torch
and the packages torch itself declares, linked from the interpreter running the tests,
before setup.sh runs: its `pip install torch==2.13.0` then finds the pin satisfied (a
pin this torch does not meet still installs), and everything zerorun needs beyond torch
(numpy among them: torch does not declare it) is still installed by the script from the
declared dependencies alone. ZERORUN_TEST_FRESH_TORCH=1 installs torch from the wheel,
as a user's first run does. The README's transcript is checked on the same run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
README_JOB = "zerorun --num_gpus 2 examples/train_toy.py --config templates/zero2.yaml"


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(# the main job.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README's quick start lost its bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def _torch_closure() -> list[metadata.Distribution]:
    """torch and what it declares, transitively (no extras): what `pip install torch` brings."""
    seen: dict[str, metadata.Distribution] = {}
    todo = ["torch"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen[name] = dist = metadata.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _link_torch(venv: Path, into: Path) -> None:
    """A fresh venv that sees torch's closure through a .pth line: nothing else of this interpreter's."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    into.mkdir()
    for dist in _torch_closure():
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if ".." not in Path(str(f)).parts}
        tops = {top for top in tops if not top.endswith(".pth")}  # a linked folder runs no .pth
        for top in tops:
            if (site / top).exists() and not (into / top).exists():
                (into / top).symlink_to(site / top)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / version / "site-packages" / "linked_torch.pth").write_text(f"{into}\n")


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
    if not os.environ.get("ZERORUN_TEST_FRESH_TORCH"):
        _link_torch(venv, tmp_path / "linked")
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
