"""Put ``deepspeed`` and ``ds_report`` commands backed by zerorun into an environment's ``bin``.

pip cannot install a console script only where DeepSpeed is absent, so zerorun ships no
``deepspeed`` entry point (one would overwrite DeepSpeed's, or be overwritten by it);
``zerorun link-deepspeed`` writes the two scripts on request instead and refuses where a
real DeepSpeed is importable or a ``deepspeed`` file that is not zerorun's is in the way.
Each script starts with the interpreter that ran the command, so it runs this zerorun.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from pathlib import Path

from zerorun.compat.activate import real_deepspeed_location
from zerorun.errors import ZerorunError

MARKER = "# zerorun: DeepSpeed's command, run by zerorun"
COMMANDS = {"deepspeed": "zerorun.compat.ds_command", "ds_report": "zerorun.compat.ds_report"}


def script_text(module: str, python: str) -> str:
    """The file written for one command: a shebang to ``python``, the marker, a call of ``module.main``."""
    return (f"#!{python}\n{MARKER}\nimport sys\n\nfrom {module} import main\n\n"
            f"if __name__ == '__main__':\n    sys.exit(main())\n")


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a script this command wrote (it carries the marker line)."""
    try:
        return MARKER in path.read_text(errors="replace").splitlines()[:3]
    except (OSError, IndexError):
        return False


def default_bin() -> Path:
    """The ``bin`` of the running environment (where pip puts console scripts)."""
    return Path(sysconfig.get_path("scripts"))


def _refuse_real_deepspeed(path: list[str]) -> None:
    real = real_deepspeed_location(path)
    if real is not None:
        raise ZerorunError(f"a real DeepSpeed is installed here ({real}); its `deepspeed` command is DeepSpeed's",
                           "leave it, or run zerorun's drop-in with `zerorun --as_deepspeed ...` from a venv without DeepSpeed")


def _write(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def link(bin_dir: Path | None = None, python: str | None = None, path: list[str] | None = None) -> list[Path]:
    """Write the commands into ``bin_dir``; return their paths. Nothing is written if any check fails."""
    bin_dir = default_bin() if bin_dir is None else bin_dir
    _refuse_real_deepspeed(sys.path if path is None else path)
    if not bin_dir.is_dir():
        raise ZerorunError(f"{bin_dir} is not a folder", "give an existing folder on PATH with --bin-dir")
    targets = {name: bin_dir / name for name in COMMANDS}
    for target in targets.values():
        if (target.exists() or target.is_symlink()) and not is_ours(target):
            raise ZerorunError(f"{target} exists and is not zerorun's", "remove it first if it is not DeepSpeed's")
    for name, target in targets.items():
        _write(target, script_text(COMMANDS[name], python or sys.executable))
    return list(targets.values())


def unlink(bin_dir: Path | None = None) -> list[Path]:
    """Remove the commands this module wrote (and nothing else); return what was removed."""
    bin_dir = default_bin() if bin_dir is None else bin_dir
    removed = [bin_dir / n for n in COMMANDS if is_ours(bin_dir / n)]
    for target in removed:
        target.unlink()
    return removed
