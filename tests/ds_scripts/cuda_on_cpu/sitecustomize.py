"""CUDA-only device calls of an upstream script made no-ops on a CPU-only torch, for either engine alike.

DeepSpeedExamples' scripts call ``torch.cuda.set_device`` and ``torch.cuda.reset_peak_memory_stats``
unconditionally; a CPU-only torch raises AttributeError there (no ``torch._C._cuda_setDevice``), under
DeepSpeed as under zerorun. A test that runs such a script byte for byte on CPU puts this folder on
PYTHONPATH, so the script stays unchanged and both engines see the same patched torch. Nothing is
patched where CUDA exists. torch is patched only once something imports ``torch.cuda`` (a launcher
that never imports torch pays nothing).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

NOOPS = ("set_device", "reset_peak_memory_stats", "reset_max_memory_allocated", "synchronize")


def _patch(cuda: ModuleType) -> None:
    if cuda.is_available():
        return
    for name in NOOPS:
        setattr(cuda, name, lambda *args, **kwargs: None)


class _AfterTorchCuda(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of ``torch.cuda`` to patch the module once it ran."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201  (the finder protocol)
        if name != "torch.cuda":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AfterTorchCuda())
