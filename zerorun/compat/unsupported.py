"""One clear error for every DeepSpeed feature zerorun does not implement."""

from __future__ import annotations

from typing import Any, NoReturn

from zerorun.errors import ZerorunError


class UnsupportedFeature(ZerorunError, NotImplementedError):
    """A DeepSpeed feature the zerorun engine does not implement."""


def unsupported(feature: str, hint: str | None = None) -> NoReturn:
    """Raise :class:`UnsupportedFeature` naming ``feature``."""
    raise UnsupportedFeature(
        f"DeepSpeed's {feature} is not implemented by zerorun (running as `deepspeed`)",
        hint or "remove it from the script/config, or run the script with real DeepSpeed installed "
                "(without --as_deepspeed)")


class UnsupportedAttribute(UnsupportedFeature, AttributeError):
    """A name on an unsupported stand-in (an AttributeError, so ``hasattr`` probes answer False)."""


class _StandIn(type):
    """The metaclass of stand-ins: class attributes (``MoE.some_helper``) name the feature too."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnsupportedAttribute(f"DeepSpeed's {cls._feature}.{name} is not implemented by zerorun "
                                   "(running as `deepspeed`)", "remove it from the script, or run it with real "
                                   "DeepSpeed installed (without --as_deepspeed)")


def unsupported_class(name: str, feature: str) -> type:
    """A class whose construction raises: lets ``from deepspeed.x import Name`` succeed, fails on use."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unsupported(feature)

    return _StandIn(name, (), {"__init__": __init__, "_feature": feature,
                               "__doc__": f"Not implemented by zerorun: {feature}."})
