"""Errors raised by the engine. Each names what went wrong and how to fix it."""

from __future__ import annotations

from zerorun.errors import ZerorunError


class EngineError(ZerorunError):
    """A user-fixable problem found while building or running the engine."""


def rank_prefixed(rank: int, message: str) -> str:
    """Errors inside ranks start with ``[rank N]`` so a launcher's merged log shows who failed."""
    return f"[rank {rank}] {message}"


class MissingModel(EngineError, AssertionError):
    """``initialize`` without a model. Also an ``AssertionError``: DeepSpeed asserts it, and callers catch that."""


class DeepSpeedAssertion(EngineError, AssertionError):
    """A misuse DeepSpeed refuses with an ``assert``: also an ``AssertionError`` whose message starts with
    DeepSpeed's words, since scripts and tests catch that."""


class NoSyncMisuse(DeepSpeedAssertion):
    """``no_sync()`` at stage 2/3, entered twice, or ``step()`` inside it."""


class CoalesceUnsupported(EngineError, NotImplementedError):
    """``coalesce_grad_reduction()`` where DeepSpeed refuses it (stage 0, pipeline parallelism): also a
    ``NotImplementedError``, which DeepSpeed raises there."""


class LossScalingRequired(EngineError, RuntimeError):
    """A plain ``loss.backward()`` under fp16's dynamic loss scale without ``engine.scale(loss)``: raised as
    its backward starts (before any gradient), a ``RuntimeError`` with DeepSpeed 0.19.8's words."""
