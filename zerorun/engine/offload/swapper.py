"""Tensor swap files under ``nvme_path``, read and written by a pool of ``buffer_count`` threads.

Why threads and not a kernel AIO binding: file reads and writes release the GIL, so
``buffer_count`` threads keep that many requests in flight, which saturates a local
NVMe for the multi-MB tensors swapped here; the AIO bindings on PyPI (``libaio``,
``pyaio``, ``caio``) are thin, asyncio-oriented or little maintained, and would add a
native dependency for no measured gain at this size.

One directory per swapper (``zerorun-swap-<host>-<pid>-<n>``, mode 0700) holds one file per
tensor (mode 0600, opened without following symlinks), so other users of a shared disk
cannot read the model's state;
beside it, ``<that name>.lock`` is held (``flock``) by the owner for as long as it lives.
Both are removed by :meth:`Swapper.close`, when the swapper is garbage-collected, and at
interpreter exit (also after an exception). A SIGKILL leaves it behind, but its lock dies
with the process: the next swapper started on the same path removes every directory of
this host whose lock it can take, and never one whose owner still runs.

Tensor bytes are read and written through a ``ctypes`` view of the CPU tensor's memory,
so no numpy is needed (it is not a dependency).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import os
import shutil
import socket
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from zerorun.engine.offload.policy import OffloadError
from zerorun.engine.physical_memory import trim_heap

_COUNTER = itertools.count()


def release_freed_memory() -> None:
    """Hand the just-freed swap buffers back to the OS.

    Buffers read by the pool threads come from per-thread malloc arenas (glibc raises its
    mmap threshold after the first free), so without a trim the process keeps them mapped
    and the resident set never shrinks between steps.
    """
    trim_heap()


def check_space(path: Path, need_bytes: int, key: str = "offload_optimizer") -> None:
    """Raise before training if ``path`` cannot hold ``need_bytes`` more (``key``: the config block, for the message)."""
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise OffloadError(f"{key}.nvme_path {path}: {free / 2**20:,.1f} MiB free, but the swap files "
                           f"of this rank need {need_bytes / 2**20:,.1f} MiB",
                           f"free space there, point nvme_path at a larger disk, or use {key.rsplit('.', 1)[-1]}.device: cpu")


def _bytes(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (the caller keeps ``t`` alive)."""
    assert t.device.type == "cpu" and t.is_contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _write(path: Path, t: torch.Tensor) -> None:
    data = t.detach().contiguous()  # held here while the view of its memory is written
    # 0600, never through a symlink: a shared /local_nvme must not show other users the weights
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    with open(fd, "wb", buffering=0) as f:
        f.write(_bytes(data))


def _read(path: Path, numel: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(numel, dtype=dtype, device="cpu")
    with open(path, "rb", buffering=0) as f:
        got = f.readinto(_bytes(out))
    if got != out.numel() * out.element_size():
        raise OffloadError(f"swap file {path} is truncated ({got} bytes)", "check the disk under nvme_path")
    return out


PREFIX = "zerorun-swap-"
LOCK = ".lock"
DIR_MODE = 0o700  # the swap directory and its files are this user's alone: they hold the model's state
FILE_MODE = 0o600


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def _try_lock(path: Path, create: bool = False) -> int | None:
    """An fd holding an exclusive ``flock`` on ``path``, or None when a live process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0), FILE_MODE)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _mine(path: Path) -> bool:
    """``path`` exists, is no symlink, and belongs to this user."""
    try:
        return not path.is_symlink() and path.lstat().st_uid == os.getuid()
    except OSError:
        return False


def remove_stale(root: Path) -> list[Path]:
    """Remove the swap directories under ``root`` left by dead processes of this host; return them.

    A directory is stale when its lock file can be locked: the owner held the lock for its
    whole life, and the kernel drops it when the owner dies, SIGKILL included. Directories
    of other hosts (a shared disk), of other users, symlinks and those without a lock file
    are left alone.
    """
    removed = []
    for lock in sorted(root.glob(f"{PREFIX}{_host()}-*{LOCK}")):
        d = lock.with_name(lock.name[: -len(LOCK)])
        if not (_mine(lock) and _mine(d)):
            continue
        fd = _try_lock(lock)
        if fd is None:
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


def _make_dir(root: Path) -> tuple[Path, int]:
    """A new swap directory and the fd locking it. The lock file is made and locked under a
    hidden name, then renamed into view, so :func:`remove_stale` never sees it unlocked."""
    name = f"{PREFIX}{_host()}-{os.getpid()}-{next(_COUNTER)}"
    hidden = root / f".{name}{LOCK}"
    fd = _try_lock(hidden, create=True)
    if fd is None:
        raise OSError(f"cannot lock {hidden}")
    try:
        (root / name).mkdir(mode=DIR_MODE)
        os.chmod(root / name, DIR_MODE)  # exactly 0700, whatever the umask
        os.rename(hidden, root / f"{name}{LOCK}")
    except OSError:
        hidden.unlink(missing_ok=True)
        os.close(fd)
        raise
    return root / name, fd


def _remove(path: str, fd: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(path + LOCK)
    os.close(fd)


def _done(value: object) -> Future:
    done: Future = Future()
    done.set_result(value)
    return done


class Swapper:
    def __init__(self, root: Path, workers: int, need_bytes: int, key: str = "offload_optimizer") -> None:
        from zerorun import simulate

        self.written_bytes = 0
        self.read_bytes = 0
        # a simulated world on meta (zerorun.simulate): tensors hold no bytes, so no file is made or read
        self.weightless = simulate.device_type() == "meta"
        if self.weightless:
            self.stale_removed: list[Path] = []
            return
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.stale_removed = remove_stale(root)
            self.dir, fd = _make_dir(root)
            probe = self.dir / ".probe"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as e:
            raise OffloadError(f"{key}.nvme_path {root} is not a writable directory ({e})",
                               "point nvme_path at a directory this user can write on every node") from e
        self._cleanup = weakref.finalize(self, _remove, str(self.dir), fd)
        try:
            check_space(root, need_bytes, key)
        except OffloadError:
            self._cleanup()
            raise
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zerorun-swap")

    def write(self, key: str, t: torch.Tensor) -> Future[None]:
        self.written_bytes += t.numel() * t.element_size()
        if self.weightless:
            return _done(None)
        return self.pool.submit(_write, self.dir / key, t)

    def read(self, key: str, numel: int, dtype: torch.dtype) -> Future[torch.Tensor]:
        self.read_bytes += numel * dtype.itemsize
        if self.weightless:  # made on this thread, where the simulation's host stand-in is active
            return _done(torch.empty(numel, dtype=dtype, device="cpu"))
        return self.pool.submit(_read, self.dir / key, numel, dtype)

    def close(self) -> None:
        if self.weightless:
            return
        self.pool.shutdown(wait=True)
        self._cleanup()
