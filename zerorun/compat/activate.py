"""Whether, and how, the ``deepspeed`` compatibility package goes on the import path.

``ZERORUN_AS_DEEPSPEED``: unset/``0`` - off; ``1`` - on unless a real DeepSpeed is
installed (then it is used and a warning says so); ``force`` - on even then.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import warnings
from collections.abc import Mapping, Sequence

from zerorun.compat import ENV_VAR, SITEDIR


def mode(env: Mapping[str, str]) -> str:
    """``"off"``, ``"on"`` or ``"force"`` from the environment variable."""
    value = env.get(ENV_VAR, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return "off"
    return "force" if value == "force" else "on"


def real_deepspeed_location(path: Sequence[str]) -> str | None:
    """Where a real ``deepspeed`` package is on ``path`` (our own directory excluded), else None."""
    own = str(SITEDIR)
    spec = importlib.machinery.PathFinder.find_spec("deepspeed", [p for p in path if p and p != own])
    if spec is None:
        return None
    return spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]


def wanted(env: Mapping[str, str], path: Sequence[str]) -> bool:
    """True if the compatibility package should be importable as ``deepspeed``."""
    m = mode(env)
    if m == "off":
        return False
    real = real_deepspeed_location(path)
    if real is not None and m != "force":
        warnings.warn(f"{ENV_VAR}=1 but a real DeepSpeed is installed ({real}); using it. "
                      f"Set {ENV_VAR}=force to run on zerorun anyway", stacklevel=2)
        return False
    return True


def rank_env(env: Mapping[str, str], path: Sequence[str] | None = None) -> dict[str, str]:
    """The rank's extra variables: ``PYTHONPATH`` with the compatibility directory first, if wanted.

    A real DeepSpeed is looked for on the rank's own ``PYTHONPATH`` and on this
    interpreter's path (the agent runs the ranks' Python).
    """
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITEDIR)]
    if not wanted(env, [*rest, *(sys.path if path is None else path)]):
        return {}
    return {"PYTHONPATH": os.pathsep.join([str(SITEDIR), *rest])}


def install() -> bool:
    """Put the compatibility directory first on ``sys.path`` if wanted (the ``.pth`` startup hook)."""
    if not wanted(os.environ, sys.path):
        return False
    if str(SITEDIR) not in sys.path:
        sys.path.insert(0, str(SITEDIR))
    return True
