"""Checkpoints that are never torn and load at any world size and stage.

``save_checkpoint`` / ``load_checkpoint`` (also methods of the engine, DeepSpeed's
signatures), ``consolidate`` / ``convert`` (one full state dict, no process group).
See ``manifest`` for the layout on disk and ``reshard`` for the arithmetic.
"""

from zerorun.engine.checkpoint.consolidate import consolidate, convert, write_state_dict
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.load import list_tags, load_checkpoint
from zerorun.engine.checkpoint.saving import save_checkpoint

__all__ = ["CheckpointError", "consolidate", "convert", "list_tags", "load_checkpoint", "save_checkpoint",
           "write_state_dict"]
