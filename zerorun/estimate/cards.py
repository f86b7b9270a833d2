"""GPU memory as users type it: the card (``h100``, ``4090``) or the size on its label (``24GB``).

A "24 GB" card has 24 GiB of memory: vendors label GPU memory in binary units and call them
GB. So for ``--gpu-memory``, ``GB`` and ``G`` (and a bare number) mean GiB, the card's
label; an exact size is written in another unit (``81559MiB``, ``80e9B``). A card name gives the capacity the driver reports (nvidia-smi's or
rocm-smi's total), which for some cards is a little under the label.
"""

from __future__ import annotations

MiB = 2**20

CARDS: dict[str, int] = {
    "3090": 24576 * MiB,
    "4090": 24564 * MiB,
    "a100-40": 40960 * MiB,
    "a100-80": 81920 * MiB,
    "h100": 81559 * MiB,
    "h200": 143771 * MiB,
    "l40s": 46068 * MiB,
    "mi300x": 196592 * MiB,
}
"""Card name -> its memory as the driver reports it (total, before the CUDA context)."""

_ALIASES = {"rtx3090": "3090", "rtx4090": "4090", "a100": "a100-80", "a10040": "a100-40", "a10080": "a100-80",
            "a100-40gb": "a100-40", "a100-80gb": "a100-80", "h100-80": "h100", "h100-80gb": "h100"}


def card_memory(text: str) -> tuple[str, int] | None:
    """``(card, bytes)`` when ``text`` names a known card (case, spaces and ``rtx`` prefix aside), else None."""
    key = text.strip().lower().replace(" ", "").replace("_", "-")
    key = _ALIASES.get(key, _ALIASES.get(key.replace("-", ""), key))
    return (key, CARDS[key]) if key in CARDS else None


def label_unit(text: str) -> str:
    """``24GB`` -> ``24GiB``: the size on a card's label is binary, whatever it calls itself."""
    stripped = text.strip()
    lower = stripped.lower()
    for unit in ("gb", "g"):
        if lower.endswith(unit) and lower[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return stripped[: -len(unit)].strip() + "GiB"
    return stripped


def names() -> str:
    return ", ".join(CARDS)


def gpu_memory_note(text: str, value: int) -> str:
    """How ``--gpu-memory text`` was read, for the output's notes."""
    card = card_memory(text)
    if card is not None:
        return f"--gpu-memory {text}: {value / 2**30:.1f} GiB per GPU, the {card[0]}'s total as its driver reports it"
    if label_unit(text) != text.strip():
        return (f"--gpu-memory {text}: {value / 2**30:.1f} GiB per GPU (GB as on a card's label, which means GiB: "
                "a 24 GB card has 24 GiB)")
    return f"--gpu-memory {text}: {value / 2**30:.1f} GiB per GPU"
