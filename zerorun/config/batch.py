"""The batch triple: train_batch_size = micro_batch x grad_accum x world_size.

Pure arithmetic. Any two may be given and the third is derived (DeepSpeed's table;
one given alone means grad_accum 1; none means micro batch 1). Unlike DeepSpeed, nothing is floored: a value
that does not divide is an error that prints the numbers and a corrected value.
"""

from __future__ import annotations

from dataclasses import dataclass

TBS, MBS, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


class BatchError(ValueError):
    """An impossible batch triple; ``path`` is the key to fix, ``hint`` the fix."""

    def __init__(self, path: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class BatchPlan:
    """A consistent triple and which of its values were derived."""

    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    derived: tuple[str, ...]


def _neighbours(value: int, unit: int) -> str:
    low, high = (value // unit) * unit, (value // unit + 1) * unit
    return f"{low} or {high}" if low > 0 else f"{high}"


def _divide(tbs: int, unit: int, unit_text: str, derived: str) -> int:
    if tbs % unit:
        raise BatchError(
            TBS,
            f"{TBS} ({tbs}) is not divisible by {unit_text} = {unit}, so {derived} cannot be derived",
            f"set {TBS} to {_neighbours(tbs, unit)}, or give {derived} instead of {TBS}",
        )
    return tbs // unit


def resolve_batch(tbs: int | None, mbs: int | None, gas: int | None, world_size: int) -> BatchPlan:
    """The full triple for ``world_size`` ranks, or ``BatchError`` naming the fix."""
    if tbs is None and mbs is None:
        # DeepSpeed refuses this; the micro batch only counts samples here (the script
        # feeds the batches), so 1 is a safe default that the note makes visible.
        derived = (MBS, TBS) if gas is not None else (MBS, GAS, TBS)
        gas = 1 if gas is None else gas
        return BatchPlan(gas * world_size, 1, gas, derived)
    if tbs is not None and mbs is not None and gas is not None:
        product = mbs * gas * world_size
        if tbs != product:
            raise BatchError(
                TBS,
                f"{TBS} ({tbs}) != {MBS} ({mbs}) * {GAS} ({gas}) * world_size ({world_size}) = {product}",
                f"set {TBS} to {product}, or remove one of the three to have it derived",
            )
        return BatchPlan(tbs, mbs, gas, ())
    if tbs is not None and mbs is not None:
        gas = _divide(tbs, mbs * world_size, f"{MBS} ({mbs}) * world_size ({world_size})", GAS)
        return BatchPlan(tbs, mbs, gas, (GAS,))
    if tbs is not None:
        derived = (MBS,) if gas is not None else (MBS, GAS)
        gas = 1 if gas is None else gas
        text = f"{GAS} ({gas}) * world_size ({world_size})"
        mbs = _divide(tbs, gas * world_size, text, MBS)
        return BatchPlan(tbs, mbs, gas, derived)
    assert mbs is not None
    derived = (TBS,) if gas is not None else (TBS, GAS)
    gas = 1 if gas is None else gas
    return BatchPlan(mbs * gas * world_size, mbs, gas, derived)


def implied_world_size(tbs: int | None, mbs: int | None, gas: int | None) -> int | None:
    """With all three given and no world size: the world size they imply, or ``BatchError``."""
    if tbs is None or mbs is None or gas is None:
        return None
    if tbs % (mbs * gas):
        raise BatchError(
            TBS,
            f"{TBS} ({tbs}) is not divisible by {MBS} ({mbs}) * {GAS} ({gas}) = {mbs * gas} for any world size",
            f"set {TBS} to {_neighbours(tbs, mbs * gas)} (a multiple of {mbs * gas})",
        )
    return tbs // (mbs * gas)
