"""`zerorun estimate`: per-GPU memory for each ZeRO stage (filled in by the estimator work)."""

from __future__ import annotations

from zerorun.errors import ZerorunError


def command() -> None:
    """Per-GPU memory for every ZeRO stage and offload choice.

    Example: zerorun estimate --params 14B --gpus 8
    """
    raise ZerorunError("`zerorun estimate` is not built yet", hint="see the open estimate issue")
