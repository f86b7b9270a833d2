"""zerorun: ZeRO data-parallel training for PyTorch, DeepSpeed-shaped API.

The public names (``initialize``, ``zero``, ``init_distributed``,
``add_config_arguments``) are imported lazily so that ``import zerorun`` stays cheap
for the CLI and the estimator.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

if "torch" in sys.modules:  # the physical memory baseline: torch loaded, the script's model not built yet
    from zerorun.engine import physical_memory as _physical_memory  # noqa: F401

__version__ = "0.1.0"

from zerorun import rank_errors as _rank_errors  # noqa: E402

_rank_errors.install()  # zerorun's own errors in a script: message and hint, no traceback

_LAZY = {
    "initialize": ("zerorun.engine.api", "initialize"),
    "init_distributed": ("zerorun.engine.comm.bootstrap", "init_distributed"),
    "add_config_arguments": ("zerorun.engine.api", "add_config_arguments"),
    "zero": ("zerorun.zero", None),
    "simulate": ("zerorun.simulate", None),
    "progress": ("zerorun.heartbeat", "progress"),
}
_LIGHT = ("zerorun.simulate", "zerorun.heartbeat")  # no torch, no optimizer runtime to count


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'zerorun' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    if module_name not in _LIGHT:  # the engine's modules import torch._dynamo: count it in the baseline
        from zerorun.engine.physical_memory import load_optimizer_runtime

        load_optimizer_runtime()
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)


__all__ = ["__version__", *_LAZY]
