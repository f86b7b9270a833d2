"""The ready configs under ``templates/`` (one YAML file per ZeRO setup)."""

from __future__ import annotations

from pathlib import Path

from zerorun.config.problems import ConfigError, Problem
from zerorun.config.suggest import did_you_mean

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "templates"
"""templates/ at the root of the source tree (zerorun is installed editable from it)."""


def template_names() -> list[str]:
    """The template names (file stems), sorted."""
    return sorted(path.stem for path in TEMPLATE_DIR.glob("*.yaml"))


def template_path(name: str) -> Path:
    """The file of template ``name`` (``zero3`` or ``zero3.yaml``); ``ConfigError`` if unknown."""
    stem = name.removesuffix(".yaml")
    path = TEMPLATE_DIR / f"{stem}.yaml"
    if path.is_file():
        return path
    names = template_names()
    if not names:
        raise ConfigError(
            "--template",
            [Problem("", f"no templates found in {TEMPLATE_DIR}")],
            hint="install zerorun from its source tree (pip install -e .) so that templates/ is present",
        )
    problem = Problem("", f"unknown template {name!r}; known: {', '.join(names)}", did_you_mean(stem, names))
    raise ConfigError("--template", [problem], hint="zerorun print-config --template zero2")
