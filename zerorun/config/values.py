"""Value types of the config schema: strict numbers, booleans and choices.

pydantic's lax mode turns ``"yes"`` into ``True`` and ``True`` into ``1``; a config
file that says either almost certainly has a mistake, so these types accept only
what a JSON or YAML author means. Integers may be written as floats (``5e8``) when
the value is integral - the conversion is exact, ``2.5e-1`` is rejected.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError


def fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("zerorun", message)


def show(value: Any) -> str:
    """A value as the user wrote it, for messages (JSON-ish, not Python repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e6:
        return f"{value:g}"
    return repr(value) if not isinstance(value, (int, float)) else str(value)


def to_int(value: Any) -> int:
    """An integer from an int or an integral float (``5e8`` -> 500000000), exactly."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"expected an integer, got {show(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise fail(f"expected an integer, got {value!r}, which has a fractional part")
        return int(value)
    return value


def to_float(value: Any) -> float:
    """A finite float from an int or a float (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"expected a number, got {show(value)}")
    if not math.isfinite(value):
        raise fail(f"expected a finite number, got {value!r}")
    return float(value)


def to_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(f"expected true or false, got {show(value)}")
    return value


def to_flag(value: Any) -> bool:
    """A bool, or the int 0 or 1: keys DeepSpeed reads by truth alone (``"zero_allow_untested_optimizer": 1``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return to_bool(value)


def to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise fail(f"expected a string, got {show(value)}")
    return value


def _at_least(minimum: int | float, convert: Any) -> Any:
    def check(value: Any) -> Any:
        number = convert(value)
        if number < minimum:
            raise fail(f"{show(value)} is below the minimum {minimum}")
        return number

    return check


def _steps_or_never(value: Any) -> int:
    # accelerate's DeepSpeedPlugin writes float("inf") to silence DeepSpeed's progress lines
    if isinstance(value, float) and value == math.inf:
        return 0
    return _at_least(1, to_int)(value)


def _between(low: float, high: float) -> Any:
    def check(value: Any) -> float:
        number = to_float(value)
        if not low <= number <= high:
            raise fail(f"{show(value)} is not between {low:g} and {high:g}")
        return number

    return check


def _positive(value: Any) -> float:
    number = to_float(value)
    if number <= 0:
        raise fail(f"{show(value)} must be greater than 0")
    return number


def choice(*allowed: Any) -> Any:
    """A validator for one of ``allowed``; the message lists them all."""

    def check(value: Any) -> Any:
        for option in allowed:
            if value == option and type(value) is type(option):
                return option
        if isinstance(value, float) and value.is_integer() and int(value) in allowed:
            return int(value)
        listed = ", ".join(str(option) for option in allowed)
        raise fail(f"{show(value)} is not one of {listed}")

    return check


def word_choice(*allowed: str, invalid: str = "") -> Any:
    """A validator for one of the words ``allowed``, in any letter case (DeepSpeed reads these so), given back
    as spelled in ``allowed``; ``invalid`` starts the message (DeepSpeed's own words, which scripts match)."""

    def check(value: Any) -> Any:
        for option in allowed:
            if isinstance(value, str) and value.lower() == option.lower():
                return option
        listed = ", ".join(allowed)
        raise fail(f"{invalid}{show(value)} is not one of {listed} (any letter case)")

    return check


Int = Annotated[int, BeforeValidator(to_int)]
NonNegInt = Annotated[int, BeforeValidator(_at_least(0, to_int))]
PosInt = Annotated[int, BeforeValidator(_at_least(1, to_int))]
StepsOrNever = Annotated[int, BeforeValidator(_steps_or_never)]
"""A positive step count, or ``Infinity`` (stored as 0): never."""
Float = Annotated[float, BeforeValidator(to_float)]
NonNegFloat = Annotated[float, BeforeValidator(_at_least(0.0, to_float))]
PosFloat = Annotated[float, BeforeValidator(_positive)]
Fraction = Annotated[float, BeforeValidator(_between(0.0, 1.0))]
Bool = Annotated[bool, BeforeValidator(to_bool)]
Flag = Annotated[bool, BeforeValidator(to_flag)]
"""A bool that also takes 0 or 1, for the keys DeepSpeed tests by truth (its own tests write 1)."""
Str = Annotated[str, BeforeValidator(to_str)]
