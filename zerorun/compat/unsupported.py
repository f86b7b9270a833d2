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


def unsupported_class(name: str, feature: str) -> type:
    """A class whose construction raises: lets ``from deepspeed.x import Name`` succeed, fails on use."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unsupported(feature)

    return type(name, (), {"__init__": __init__, "__doc__": f"Not implemented by zerorun: {feature}."})


class UnsupportedAttribute(UnsupportedFeature, AttributeError):
    """Reading a ``deepspeed`` attribute zerorun does not implement (an AttributeError, so
    ``hasattr`` probes answer False while direct use names the feature)."""


class UnsupportedImport(UnsupportedFeature, ImportError):
    """Importing a ``deepspeed`` submodule zerorun does not implement (an ImportError, so
    ``try: import ... except ImportError`` feature probes in integrations still work)."""


def unsupported_module(feature: str, hint: str | None = None) -> NoReturn:
    """Called at the top of a ``deepspeed`` submodule that zerorun does not implement."""
    raise UnsupportedImport(
        f"DeepSpeed's {feature} is not implemented by zerorun (running as `deepspeed`)",
        hint or "remove it from the script, or run the script with real DeepSpeed installed (without --as_deepspeed)")
