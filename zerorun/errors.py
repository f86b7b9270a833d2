"""User-facing errors: a message and a hint, shown once by the CLI's error boundary."""

from __future__ import annotations

from typing import Any, NoReturn


class ZerorunError(Exception):
    """An error the user can fix. ``hint`` says how; the CLI prints both and exits ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message}\nhint: {self.hint}"

    def __reduce__(self) -> tuple[Any, ...]:
        # picklable with its hint (a rank's error crosses multiprocessing pools and queues)
        return type(self), (self.message, self.hint), self.__dict__


class UsageError(ZerorunError):
    """The command line itself is wrong (unknown option, missing argument, bad choice): exit 2.

    ``usage`` is the command's one-line usage, printed above the error as every
    command-line tool does; the hint points at the command's ``--help``.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, usage: str | None = None) -> None:
        super().__init__(message, hint)
        self.usage = usage

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
    """A class whose construction raises: lets ``from deepspeed.x import Name`` succeed, fails on use.

    A name of an exception class (``...Error``, ``...Exception``) is a real exception class instead, one
    zerorun never raises: a script's ``except ZeRORuntimeException:`` (or ``pytest.raises``) must not
    itself fail with "catching classes that do not inherit from BaseException"."""
    if name.endswith(("Error", "Exception")):
        return _StandIn(name, (Exception,), {"_feature": feature,
                                             "__doc__": f"DeepSpeed's {name}, which zerorun never raises."})

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unsupported(feature)

    return _StandIn(name, (), {"__init__": __init__, "_feature": feature,
                               "__doc__": f"Not implemented by zerorun: {feature}."})
