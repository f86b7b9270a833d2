"""A SCRIPT that is not a file: the error names the nearest file that is ("did you mean")."""

from __future__ import annotations

import itertools
from pathlib import Path

from launcher.errors import LaunchError
from zerorun.config.suggest import did_you_mean

MAX_LISTED = 500  # a huge folder is not worth a scan for a guess


def missing_script(script: str) -> LaunchError:
    """The error for ``script``, with the closest file of its folder (or of the path as typed)."""
    path = Path(script)
    folder = path.parent
    guess = None
    if folder.is_dir():
        names = [p.name for p in itertools.islice(folder.iterdir(), MAX_LISTED) if p.is_file()]
        found = did_you_mean(path.name, names)
        guess = None if found is None else str(folder / found) if str(folder) != "." else found
    elif folder.parent.is_dir() and (near := did_you_mean(folder.name, [p.name for p in folder.parent.iterdir()
                                                                         if p.is_dir()])):
        candidate = folder.parent / near / path.name
        guess = str(candidate) if candidate.is_file() else None
    hint = f"did you mean {guess}? " if guess else ""
    return LaunchError(f"SCRIPT {script!r} is not a file",
                       hint + "check the path (relative to the working directory); "
                              "`zerorun --help` lists the commands")
