"""Where a stage-3 bucket's resting shard lives when it is not in compute memory (``offload_param``).

The mechanism reads and writes resting shards through this interface only; the store itself
(host memory or NVMe swap files, :class:`zerorun.engine.offload.params.ParamOffload`) sits
above the mechanism and is handed in by the engine's build.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ShardStore(Protocol):
    def store(self, bucket: object, shard: torch.Tensor) -> None:
        """Take ``shard`` as ``bucket``'s new resting values."""

    def read_ahead(self, bucket: object) -> None:
        """Start reading ``bucket``'s shard back (its gather comes soon)."""

    def fetch(self, bucket: object) -> torch.Tensor:
        """``bucket``'s resting shard, readable now."""

    def upload(self, dst: torch.Tensor, shard: torch.Tensor) -> None:
        """Copy a fetched ``shard`` into ``dst`` in compute memory."""

    def flush(self) -> None:
        """Every ``store`` so far is complete (written out) on return."""
