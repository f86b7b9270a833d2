"""Dtype names in a config: every spelling DeepSpeed 0.19.8 accepts, read as one canonical name.

DeepSpeed reads dtypes through its ``DtypeEnum`` (``runtime/config.py``), which takes
``"bf16"``, ``"bfloat16"`` and ``"torch.bfloat16"`` alike (and ``"half"``, ``"float"``,
...); its examples spell them all three ways. zerorun reads every dtype field through
:func:`dtype_choice`, so a config that names a dtype any of these ways validates, and the
engine sees only ``fp32``, ``fp16`` or ``bf16``. A ``torch.dtype`` object in a Python
dict config is read by its name (``str(torch.bfloat16) == "torch.bfloat16"``), so this
module needs no torch.
"""

from __future__ import annotations

from typing import Any

from zerorun.config.values import fail, show

SPELLINGS: dict[str, tuple[str, ...]] = {
    "fp32": ("fp32", "float32", "float", "torch.float32", "torch.float"),
    "fp16": ("fp16", "float16", "half", "torch.float16", "torch.half"),
    "bf16": ("bf16", "bfloat16", "torch.bfloat16"),
}
"""Canonical name -> every accepted spelling (DeepSpeed's DtypeEnum, plus torch's own aliases)."""

_CANONICAL = {spelling: name for name, spellings in SPELLINGS.items() for spelling in spellings}


def canonical_dtype(value: Any) -> str | None:
    """``value``'s canonical name (``fp32``/``fp16``/``bf16``), or None when it names no float dtype."""
    if not isinstance(value, str) and type(value).__name__ != "dtype":
        return None
    return _CANONICAL.get(str(value).strip().lower())


def dtype_choice(*allowed: str) -> Any:
    """A validator for a dtype field: any spelling of one of ``allowed`` gives its canonical name."""

    def check(value: Any) -> Any:
        name = canonical_dtype(value)
        if name in allowed:
            return name
        listed = ", ".join(f"{a} ({'/'.join(SPELLINGS[a][1:3])})" for a in allowed)
        raise fail(f"{show(value) if isinstance(value, str) else str(value)} is not a dtype here: use one of {listed}")

    return check
