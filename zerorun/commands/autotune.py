"""`zerorun autotune`: bucket and prefetch sizes by short trials (filled in by the autotune work)."""

from __future__ import annotations

from zerorun.errors import ZerorunError


def command() -> None:
    """Find the fastest bucket and prefetch sizes by short real trials.

    Example: zerorun autotune --num_gpus 2 --config ds.yaml train.py
    """
    raise ZerorunError("`zerorun autotune` is not built yet", hint="see the open autotune issue")
