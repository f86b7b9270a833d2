"""``ds_report`` / ``deepspeed.env_report``: DeepSpeed's environment report, answered for zerorun.

DeepSpeed's report lists its C++/CUDA ops and whether each is built; zerorun has none
(every kernel is torch's), so the op table says so once, and the general section gives
the same fields DeepSpeed's does, with the zerorun that answers as ``deepspeed``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def _field(name: str, value: object) -> str:
    return f"{name} {'.' * max(3, 33 - len(name))} {value}"


def general_info() -> list[tuple[str, object]]:
    """``(field, value)`` rows of DeepSpeed's "general environment info", with zerorun's answers."""
    import torch

    from zerorun import __version__
    from zerorun.compat import DEEPSPEED_VERSION, SITEDIR

    cuda = torch.version.cuda
    shm = shutil.disk_usage("/dev/shm").total if Path("/dev/shm").exists() else None
    return [
        ("torch install path", [str(Path(torch.__file__).parent)]),
        ("torch version", torch.__version__),
        ("deepspeed install path", [str(SITEDIR / "deepspeed")]),
        ("deepspeed info", f"{DEEPSPEED_VERSION} (zerorun {__version__}: DeepSpeed's API, zerorun's engine)"),
        ("torch cuda version", cuda),
        ("torch hip version", getattr(torch.version, "hip", None)),
        ("nvcc version", None),
        ("deepspeed wheel compiled w.", f"torch {torch.__version__.split('+')[0]}, cuda {cuda}"),
        ("shared memory (/dev/shm) size", "unknown" if shm is None else f"{shm / 2**30:.2f} GB"),
        ("python", sys.version.split()[0]),
    ]


def report() -> str:
    """The whole report as text."""
    rule = "-" * 50
    lines = [rule, "DeepSpeed C++/CUDA extension op report", rule,
             "zerorun runs DeepSpeed's API on torch's own kernels: no op needs building, none is missing.",
             rule, "DeepSpeed general environment info:"]
    lines += [_field(name, value) for name, value in general_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The ``ds_report`` command."""
    print(report())
    return 0


cli_main = main
