"""Parsing the numbers users type: parameter counts (``14B``) and byte sizes (``80GB``)."""

from __future__ import annotations

import math
import re

from zerorun.errors import ZerorunError

GiB = 2**30
GB = 10**9

_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)

# Binary units are what allocators and nvidia-smi report; decimal units are what vendors print.
_BYTE_SUFFIX = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


class CountError(ZerorunError):
    """A parameter count or a size the estimator cannot read."""


def parse_param_count(text: str | int) -> int:
    """``"14B"`` -> 14_000_000_000. Accepts ``7.5b``, ``350M``, ``1.3e9``, ``125000000``, ``20k``, ``1T``."""
    if isinstance(text, int):
        value: float = text
    else:
        match = _COUNT_RE.match(str(text))
        if match is None:
            raise CountError(
                f"cannot read the parameter count {text!r}",
                hint="write it like 14B, 7.5b, 350M, 1.3e9 or 125000000",
            )
        value = float(match.group(1)) * _COUNT_SUFFIX[match.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise CountError(f"the parameter count {text!r} must be at least 1", hint="for example --params 7B")
    return round(value)


def parse_bytes(text: str | int) -> int:
    """``"80GB"`` -> 80e9, ``"80GiB"`` -> 80 * 2**30, ``"512MiB"``; a bare number is bytes."""
    if isinstance(text, int):
        return text
    match = _BYTES_RE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _BYTE_SUFFIX:
        raise CountError(
            f"cannot read the size {text!r}",
            hint="write it with a unit: 80GB (10^9 bytes), 80GiB (2^30 bytes), 512MiB",
        )
    value = float(match.group(1)) * _BYTE_SUFFIX[unit]
    if not math.isfinite(value) or value < 0:
        raise CountError(f"the size {text!r} must be a non-negative number", hint="for example 80GB")
    return round(value)


GPU_MEMORY_RANGE = (2**26, 2**46)
"""64 MiB to 64 TiB: a per-GPU memory outside this is a typo (``80`` meant as bytes, ``80TB``)."""


def parse_gpu_memory(text: str, flag: str = "--gpu-memory") -> int:
    """Memory per GPU as users type it (zerorun.estimate.cards): a card (``h100``: the driver's total),
    or its label's size: ``80GB``, ``80G``, ``80GiB`` and a bare ``80`` are all 80 GiB, as GPUs are sold.

    A value outside ``GPU_MEMORY_RANGE`` is an error, not a chart of absurd numbers.
    """
    from zerorun.estimate.cards import card_memory, label_unit, names

    card = card_memory(str(text))
    if card is not None:
        return card[1]
    bare = _COUNT_RE.match(str(text))
    try:
        value = parse_bytes(f"{text}GiB" if bare and not bare.group(2) else label_unit(str(text)))
    except CountError as e:
        raise CountError(f"{flag} {text!r}: {e.message}", hint=f"a card ({names()}) or its memory: 80GB "
                         "(the label's GB, = GiB), 24, 81559MiB") from e
    lo, hi = GPU_MEMORY_RANGE
    if not lo <= value <= hi:
        raise CountError(f"{flag} {text!r} is {value / GiB:.3g} GiB, not the memory of one GPU",
                         hint=f"give the memory of one GPU, e.g. {flag} 80GB, {flag} 24 (GiB) or {flag} h100")
    return value


def gib(n_bytes: float) -> float:
    """Bytes to GiB (2**30 bytes), the unit every table of the estimator prints."""
    return n_bytes / GiB


def human_bytes(n_bytes: float) -> str:
    """``1536`` -> ``1.50 KiB``, ``3 * 2**30`` -> ``3.00 GiB``: sizes as people read them."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{int(n_bytes)} B"
