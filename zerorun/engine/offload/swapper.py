"""Tensor swap files under ``nvme_path``, read and written by a pool of ``buffer_count`` threads.

Why threads and not a kernel AIO binding: file reads and writes release the GIL, so
``buffer_count`` threads keep that many requests in flight, which saturates a local
NVMe for the multi-MB tensors swapped here; the AIO bindings on PyPI (``libaio``,
``pyaio``, ``caio``) are thin, asyncio-oriented or little maintained, and would add a
native dependency for no measured gain at this size.

One directory per process (``zerorun-swap-<pid>-<n>``) holds one file per tensor. It is
removed by :meth:`Swapper.close`, when the swapper is garbage-collected, and at
interpreter exit (also after an exception); only a SIGKILL leaves it behind.
"""

from __future__ import annotations

import itertools
import os
import shutil
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from zerorun.engine.offload.policy import OffloadError

_COUNTER = itertools.count()


def check_space(path: Path, need_bytes: int, key: str = "offload_optimizer") -> None:
    """Raise before training if ``path`` cannot hold ``need_bytes`` more (``key``: the config block, for the message)."""
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise OffloadError(f"{key}.nvme_path {path}: {free / 2**20:,.1f} MiB free, but the swap files "
                           f"of this rank need {need_bytes / 2**20:,.1f} MiB",
                           f"free space there, point nvme_path at a larger disk, or use {key.rsplit('.', 1)[-1]}.device: cpu")


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().contiguous().view(torch.uint8).numpy())


def _write(path: Path, t: torch.Tensor) -> None:
    with open(path, "wb", buffering=0) as f:
        f.write(_bytes(t))


def _read(path: Path, numel: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(numel, dtype=dtype)
    with open(path, "rb", buffering=0) as f:
        got = f.readinto(_bytes(out))
    if got != out.numel() * out.element_size():
        raise OffloadError(f"swap file {path} is truncated ({got} bytes)", "check the disk under nvme_path")
    return out


class Swapper:
    def __init__(self, root: Path, workers: int, need_bytes: int, key: str = "offload_optimizer") -> None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.dir = root / f"zerorun-swap-{os.getpid()}-{next(_COUNTER)}"
            self.dir.mkdir()
            probe = self.dir / ".probe"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as e:
            raise OffloadError(f"{key}.nvme_path {root} is not a writable directory ({e})",
                               "point nvme_path at a directory this user can write on every node") from e
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.dir), True)
        try:
            check_space(root, need_bytes, key)
        except OffloadError:
            self._cleanup()
            raise
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zerorun-swap")
        self.written_bytes = 0
        self.read_bytes = 0

    def write(self, key: str, t: torch.Tensor) -> Future[None]:
        self.written_bytes += t.numel() * t.element_size()
        return self.pool.submit(_write, self.dir / key, t)

    def read(self, key: str, numel: int, dtype: torch.dtype) -> Future[torch.Tensor]:
        self.read_bytes += numel * torch.empty(0, dtype=dtype).element_size()
        return self.pool.submit(_read, self.dir / key, numel, dtype)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self._cleanup()
