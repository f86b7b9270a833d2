"""Checkpoint errors: each names the directory, tag or parameter and says how to fix it."""

from __future__ import annotations

from zerorun.engine.errors import EngineError


class CheckpointError(EngineError):
    """A checkpoint that cannot be saved, found or loaded into this model."""


class CheckpointArgumentError(CheckpointError, ValueError):
    """A bad argument to ``save_checkpoint``/``load_checkpoint`` (DeepSpeed raises ``ValueError``)."""
