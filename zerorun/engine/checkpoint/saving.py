"""``save_checkpoint``: the synchronous writer, or the decoupled one where ``checkpoint.writer`` asks for it.

Chosen here, above both, so the decoupled writer may build on the synchronous one's pieces
(payload, manifest, commit) without an import running back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerorun.engine.checkpoint import save
from zerorun.engine.checkpoint.decoupled import save_decoupled

if TYPE_CHECKING:
    from zerorun.engine.views import CheckpointView


def save_checkpoint(engine: CheckpointView, save_dir: str | os.PathLike[str], tag: str | None = None,
                    client_state: dict[str, Any] | None = None, save_latest: bool = True,
                    exclude_frozen: bool = False) -> Path:
    """Save a complete checkpoint as ``save_dir/tag`` (default tag ``global_step<N>``); all ranks call it.
    With ``checkpoint.writer.decoupled`` (or ``type: mock``) it returns once the state is snapshotted.
    ``exclude_frozen``: leave the frozen parameters out (DeepSpeed's ``exclude_frozen_parameters``)."""
    writer = engine.config.checkpoint.writer
    if writer.decoupled or writer.type == "MOCK":
        return save_decoupled(engine, save.checked_save_dir(save_dir), tag, client_state, save_latest, exclude_frozen)
    return save.save_checkpoint(engine, save_dir, tag, client_state, save_latest, exclude_frozen)
