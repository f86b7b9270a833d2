"""launcher/run/lifeline.py: a child started with ``die_with_parent`` does not outlive a SIGKILLed parent
(what keeps a rank from outliving its shim, and srun/mpirun from outliving the launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from launcher_conftest import alive, wait_gone

PARENT = """
import signal, subprocess, sys
from launcher.run.lifeline import die_with_parent
armed = sys.argv[1] == "armed"
child = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent(signal.SIGKILL) if armed else None)
print(child.pid, flush=True)
child.wait()
"""


def _orphan_after_parent_killed(mode: str) -> int:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=10)
    return child


def test_child_dies_with_its_parent() -> None:
    assert wait_gone([_orphan_after_parent_killed("armed")], timeout=5) == []


def test_without_the_lifeline_the_child_would_survive() -> None:  # the control: the test above can fail
    child = _orphan_after_parent_killed("plain")
    try:
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)
