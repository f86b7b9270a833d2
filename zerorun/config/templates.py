"""The ready configs under ``templates/`` (one YAML file per ZeRO setup)."""

from __future__ import annotations

from pathlib import Path

from zerorun.config.suggest import did_you_mean
from zerorun.errors import ZerorunError

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "templates"
"""templates/ at the root of the source tree (zerorun is installed editable from it)."""


def template_names() -> list[str]:
    """The template names (file stems), sorted."""
    return sorted(path.stem for path in TEMPLATE_DIR.glob("*.yaml"))


def template_path(name: str) -> Path:
    """The file of template ``name`` (``zero3`` or ``zero3.yaml``); ``ZerorunError`` if unknown."""
    stem = name.removesuffix(".yaml")
    path = TEMPLATE_DIR / f"{stem}.yaml"
    if path.is_file():
        return path
    names = template_names()
    if not names:
        raise ZerorunError(
            f"no templates found in {TEMPLATE_DIR}",
            hint="install zerorun from its source tree (pip install -e .) so that templates/ is present",
        )
    guess = did_you_mean(stem, names)
    tail = f" (did you mean {guess}?)" if guess else ""
    raise ZerorunError(
        f"unknown template {name!r}{tail}; known: {', '.join(names)}",
        hint="zerorun print-config --template zero2",
    )
