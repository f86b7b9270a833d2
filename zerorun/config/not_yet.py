"""DeepSpeed keys zerorun knows but does not implement yet: refused with what they are, never accepted.

Each is DeepSpeed 0.19.8's ``zero_optimization`` key; a config that sets one does not
load (the schema forbids it) and the problem says so in these words instead of "unknown
key". docs/zeropp.md has the plan; ``zerorun estimate``/``simulate`` ``--hpz``, ``--mics``
and ``--qwz`` show what hpZ, MiCS and qwZ would move across nodes. hpZ, MiCS and ZeRO++'s
quantized weights and gradients (qwZ, qgZ) are ``zero_optimization`` keys of the schema now.
"""

from __future__ import annotations

NOT_YET: dict[str, str] = {
    "zero_optimization.zeropp_loco_param": "ZeRO++ LoCo (error feedback for qgZ)",
}

NOT_YET_HINT = "remove it: stage 3 runs without it; `zerorun estimate --hpz/--mics/--qwz` shows what it would move"


def not_yet_message(path: str) -> str | None:
    """The refusal for ``path`` when it is a DeepSpeed key zerorun does not implement yet."""
    what = NOT_YET.get(path)
    return None if what is None else f"DeepSpeed's {what}: zerorun does not implement it yet; {NOT_YET_HINT}"


# DeepSpeed's values that turn each key off: a config that spells the default out loads as without it
OFF: dict[str, tuple[object, ...]] = {
    "zero_hpz_partition_size": (0, 1),
    "mics_shard_size": (-1, 0),
    "mics_hierarchical_params_gather": (False,),
    "zeropp_loco_param": (None,),
}


def without_off_values(data: dict[str, object]) -> dict[str, object]:
    """``data`` less the not-yet keys set to their off value (a copy; ``data`` is left alone)."""
    zero = data.get("zero_optimization")
    if not isinstance(zero, dict):
        return data
    kept = {k: v for k, v in zero.items()
            if not (k in OFF and any(v is off or (type(v) is type(off) and v == off) for off in OFF[k]))}
    return data if len(kept) == len(zero) else {**data, "zero_optimization": kept}
