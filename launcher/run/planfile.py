"""The plan file pdsh's agents read: written and read so that no one else can plant or read one.

pdsh carries no stdin, so for it the plan (with the exported env values) travels in
``CWD/.zerorun/<job>/node<K>.json`` on the shared working directory, where other
users of a group-writable project folder could reach it. So:

* the launcher creates ``.zerorun/`` and the job's folder 0700 whatever the umask
  (an existing one must be a real folder of this user's, and is tightened to 0700),
  and the file with ``O_CREAT | O_EXCL | O_NOFOLLOW``, 0600: a planted file or
  symlink makes the launch fail instead of being followed or overwritten;
* the job id is fresh for every attempt (restarts included), so no name is reused;
* the agent opens the folder without following a symlink, checks that it and the
  file belong to this user with no group/other bits, then reads and deletes the file.

Every step goes through the folder's descriptor, so nothing can be swapped between
the check and the use.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from launcher.errors import LaunchError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _open_private_dir(name: str, dir_fd: int | None, shown: str) -> int:
    """Create ``name`` 0700 unless it exists; open it (no symlink), check it is ours, tighten it to 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        raise LaunchError(f"{shown} is not a folder zerorun can use ({e.strerror}: a symlink or a file?)",
                          f"remove {shown}; zerorun creates it, private to you") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise LaunchError(f"{shown} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})",
                          f"someone else created it: remove {shown}, zerorun recreates it private to you")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd


def write_plan_file(path: str, data: str) -> None:
    """Write ``data`` to ``path`` (``.../.zerorun/<job>/node<K>.json``), 0600 in 0700 folders, never over anything."""
    p = Path(path)
    top = _open_private_dir(str(p.parent.parent), None, str(p.parent.parent))
    try:
        job = _open_private_dir(p.parent.name, top, str(p.parent))
    finally:
        os.close(top)
    try:
        try:
            fd = os.open(p.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=job)
        except FileExistsError:
            raise LaunchError(f"the plan file {path} exists already (planted, or a stale file or symlink)",
                              f"remove {p.parent}; every attempt writes its own new files") from None
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
    finally:
        os.close(job)


def _refuse(path: str, why: str) -> SystemExit:
    return SystemExit(f"zerorun agent: refusing the plan file {path}: {why} (someone else may have planted it; "
                      "the launcher writes it 0600 in a 0700 folder of yours)")


def _check_private(fd: int, path: str, kind: str) -> None:
    """``fd`` is this user's, and neither group nor others may touch it."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"its {kind} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        raise _refuse(path, f"its {kind} has mode {stat.S_IMODE(st.st_mode):o}, open to other users")


def read_plan_file(path: str) -> str:
    """The text of the plan file at ``path``, deleted once read, after checking the file and its folder."""
    p = Path(path)
    try:
        dir_fd = os.open(p.parent, _DIR_FLAGS)
    except OSError as e:
        raise _refuse(path, f"its folder cannot be opened as a real folder ({e.strerror})") from None
    try:
        _check_private(dir_fd, path, "folder")
        try:
            fd = os.open(p.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as e:
            raise _refuse(path, f"it cannot be opened as a plain file ({e.strerror})") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise _refuse(path, "it is not a plain file with one name")
            _check_private(fh.fileno(), path, "file")
            text = fh.read().decode()
        os.unlink(p.name, dir_fd=dir_fd)
        return text
    finally:
        os.close(dir_fd)
