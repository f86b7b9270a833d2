"""Launcher entry point (placeholder: runs the script as one local process)."""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    """Run ``argv`` (``SCRIPT [args]``) as one local Python process and return its exit code."""
    if not argv:
        print("usage: zerorun [launcher options] SCRIPT [script args]", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, *argv])
