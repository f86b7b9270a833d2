"""``deepspeed.runtime.zero.tiling``: ``TiledLinear`` and ``TiledLinearReturnBias`` (zerorun.compat.tiling)."""

from zerorun.compat.tiling import TiledLinear, TiledLinearReturnBias  # noqa: F401
