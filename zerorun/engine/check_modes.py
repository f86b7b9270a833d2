"""The modes a ``ZERORUN_CHECK_*`` variable turns on: the CPU stand-ins for what only a GPU
would show (collectives in flight, queued copies), parsed alike for every kind of check."""

from __future__ import annotations

from collections.abc import Mapping

from zerorun.engine.errors import EngineError


def env_modes(variable: str, known: frozenset[str], env: Mapping[str, str]) -> frozenset[str]:
    """The comma-separated modes ``variable`` names in ``env`` (none when unset); an unknown one is an error."""
    modes = frozenset(m.strip().lower() for m in env.get(variable, "").split(",") if m.strip())
    unknown = sorted(modes - known)
    if unknown:
        raise EngineError(f"{variable} names unknown mode(s) {', '.join(unknown)}",
                          f"use a comma-separated list of {', '.join(sorted(known))}, or unset it")
    return modes
