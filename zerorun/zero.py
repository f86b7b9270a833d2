"""ZeRO stage 3 helpers with DeepSpeed's names: ``zero.Init`` and ``zero.GatheredParameters``.

The mechanics live in :mod:`zerorun.engine.mechanism.gathered`; this module is the public name a
DeepSpeed script reaches (``deepspeed.zero`` maps here).
"""

from __future__ import annotations

from zerorun.engine.mechanism.gathered import GatheredParameters, Init

__all__ = ["GatheredParameters", "Init"]
