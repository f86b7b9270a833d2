"""Decoupled saves (``checkpoint.writer.decoupled: true``): training blocks for a host snapshot only.

``save_checkpoint`` then does, on the training thread (every rank):

1. agree on the tag; wait for a free snapshot slot (``io_buffer_double``: two, else one);
2. raise, on every rank, what an earlier background write failed with (one all-reduce);
3. rank 0 sweeps crashed staging folders (not the ones still being written) and creates
   ``.TAG.saving``; every rank learns that it exists (one all-reduce);
4. copy this rank's chunk of every master and optimizer state, the small state, the
   ``client_state`` (serialized) and, on rank 0, the buffers and the manifest, to host memory;
5. queue the snapshot for the background writer (:mod:`writer`) and return.

The writer then writes the same files a synchronous save writes, the same way (a fresh
temporary name, fsync, rename, fsync of the folder). No collective runs in the background:
rank 0's writer waits until every rank's file is in the staging folder (each file appears
under its final name only when it is durable) or a rank's ``failed_NNNNN`` note says it
could not write, then commits as a synchronous save does (manifest, rename, ``latest``
last). A crash or kill at any moment leaves ``latest`` naming the previous complete tag.
A failure is raised on every rank at the next save or load (step 1). Memory: at most
``slots`` snapshots of this rank's checkpoint bytes (its rank file, plus ``extra.pt`` on
rank 0) are held at once.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

from zerorun.atomic_file import write_with
from zerorun.engine.checkpoint import atomic, layout, save
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.manifest import EXTRA, Manifest, client_file, rank_file
from zerorun.engine.checkpoint.tag_check import agreed_tag
from zerorun.engine.checkpoint.writer import BackgroundWriter
from zerorun.engine.mechanism.gathered import gathered_frozen

if TYPE_CHECKING:
    from zerorun.config.schema_blocks import CheckpointWriterConfig
    from zerorun.engine.views import CheckpointView

PEER_TIMEOUT_S = float(os.environ.get("ZERORUN_CHECKPOINT_PEER_TIMEOUT_S", "1800"))
_WRITERS: weakref.WeakKeyDictionary[Any, BackgroundWriter] = weakref.WeakKeyDictionary()


def writer_of(engine: CheckpointView) -> BackgroundWriter | None:
    """The engine's background writer, if it has saved decoupled (teardown calls its ``close()``)."""
    return _WRITERS.get(engine)


class HostBuffers:
    """Host tensors a snapshot copies into, reused save after save (the double buffer).

    A fresh host allocation costs a page fault per page on first touch (seconds for a few
    hundred MB on a busy host); a copy into a buffer the previous save used costs a
    ``memcpy``. A written snapshot gives its buffers back; at most ``slots`` snapshots' worth
    exist, and they stay allocated for the engine's life. A CUDA tensor is copied into
    pinned memory (asynchronously; ``sync`` waits at the end of the snapshot).
    """

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.cuda = False

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype)
        with self._lock:
            free = self._free.get(key)
            buf = free.pop() if free else None
        if buf is None:
            buf = torch.empty(key[0], dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
        self.cuda |= t.is_cuda
        return buf.copy_(t.detach(), non_blocking=t.is_cuda)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def release(self, payload: dict[str, Any] | None) -> None:
        """Give back the chunk buffers of a written rank payload."""
        if payload is None:
            return
        with self._lock:
            for bucket in payload["buckets"]:
                for t in [bucket["master"], *bucket["state"].values()]:
                    if torch.is_tensor(t) and t.dim() == 1:
                        self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)


_BUFFERS: weakref.WeakKeyDictionary[Any, HostBuffers] = weakref.WeakKeyDictionary()


def _writer_for(engine: CheckpointView) -> BackgroundWriter:
    writer = _WRITERS.get(engine)
    if writer is None:
        writer = _WRITERS[engine] = BackgroundWriter(2 if engine.config.checkpoint.writer.io_buffer_double else 1)
        _BUFFERS[engine] = HostBuffers()
    return writer


def settle(engine: CheckpointView, what: str = "a background checkpoint write") -> None:
    """Every rank: wait for this process's background writes, then learn whether every rank's (and rank 0's commit)
    succeeded; raise on all ranks if not. A collective: ``load_checkpoint`` calls it first, so no rank
    reads ``latest`` before rank 0 has rewritten it."""
    writers = list(_WRITERS.values())  # any engine's: a fresh engine may load what another one saves
    if not writers:
        return
    for writer in writers:
        writer.wait()
    errors = [e for w in writers for e in w.take_errors()]
    save.agree(engine, errors[0] if errors else None, what)


def flush_writes(engine: CheckpointView) -> None:
    """Wait for the background writer and stop it (no collective: for teardown); raises its first error."""
    writer = _WRITERS.pop(engine, None)
    if writer is not None:
        errors = writer.close()
        if errors:
            raise CheckpointError(f"[rank {engine.ctx.rank}] a background checkpoint write failed: {errors[0]}",
                                  "the previous complete tag and `latest` are untouched") from errors[0]


def _client_bytes(client_state: dict[str, Any] | None) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(client_state or {}), buffer)  # the bytes a synchronous save writes, taken now
    return buffer.getvalue()


def _snapshot(engine: CheckpointView, client_state: dict[str, Any] | None, buffers: HostBuffers,
              exclude_frozen: bool) -> dict[str, Any]:
    """Host copies of everything the files hold (collective at stage 3: frozen parameters are gathered)."""
    _, saved_rank, writes = layout.saved_world(engine)
    snap: dict[str, Any] = {"client": _client_bytes(client_state), "payload": None, "extra": None,
                            "manifest": None, "saved_rank": saved_rank}
    if writes:
        payload = save.rank_payload(engine, buffers.copy)  # every chunk copied into a reused host buffer
        buffers.sync()
        payload["engine"] = copy.deepcopy(payload["engine"])  # a scheduler's lists are its own objects
        snap["payload"] = payload
    with gathered_frozen(engine.parts.frozen):
        if engine.ctx.rank == 0:
            entries, aliases = layout.engine_layout(engine)
            stored = {p.name for b in entries for p in b.params}
            snap["extra"] = layout.extra_state(engine.module, stored, aliases, exclude_frozen)
            snap["manifest"] = save.build_manifest(engine, exclude_frozen)
    return snap


def _torch_save(obj: object, path: Path, buffer_size: int) -> int:
    def write(f: BinaryIO) -> None:
        buffered = io.BufferedWriter(f.raw, buffer_size=buffer_size)  # type: ignore[attr-defined]  # io_buffer_size bytes per write call
        torch.save(obj, buffered)
        buffered.flush()
        buffered.detach()

    write_with(path, write)
    return path.stat().st_size


class _Job:
    """One decoupled save, run on the writer thread: this rank's files, then (rank 0) the commit."""

    def __init__(self, root: Path, tag: str, rank: int, world: int, saved_world: int, snap: dict[str, Any],
                 save_latest: bool, engine_cfg: CheckpointWriterConfig, blocked_s: float, buffers: HostBuffers) -> None:
        self.root, self.tag, self.rank, self.world, self.saved_world = root, tag, rank, world, saved_world
        self.buffers = buffers
        self.snap, self.save_latest, self.cfg, self.blocked_s = snap, save_latest, engine_cfg, blocked_s
        self.staging = save.staging_dir(root, tag)

    def __call__(self) -> None:
        start, written = time.perf_counter(), 0
        try:
            written = self._write_own()
        except Exception as e:
            self.buffers.release(self.snap.get("payload"))
            self._note_failure(e)
            if self.rank == 0:
                shutil.rmtree(self.staging, ignore_errors=True)
            raise CheckpointError(f"[rank {self.rank}] background checkpoint write of {self.staging} failed: {e}",
                                  "check that the directory is writable and has free space on every node; "
                                  "the previous checkpoint and `latest` are untouched") from e
        if os.environ.get(save.PAUSE_ENV):
            time.sleep(float(os.environ[save.PAUSE_ENV]))
        if self.rank != 0:
            return
        try:
            self._wait_for_peers()
            manifest: Manifest = self.snap["manifest"]
            save.commit_staged(self.root, self.tag, manifest, self.save_latest)
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise
        if self.cfg.show_statistics:
            took = time.perf_counter() - start
            print(f"[rank 0] checkpoint {self.tag}: training blocked {self.blocked_s:.3f} s (snapshot); written "
                  f"and committed in the background in {took:.3f} s ({written / 2**20:.1f} MiB from rank 0, "
                  f"{written / 2**20 / max(took, 1e-9):.0f} MiB/s)", flush=True)

    def _write_own(self) -> int:
        size, snap = self.cfg.io_buffer_size, self.snap
        written = 0
        if snap["payload"] is not None:
            written += _torch_save(snap["payload"], self.staging / rank_file(snap["saved_rank"]), size)
        atomic.write_bytes(self.staging / client_file(self.rank), snap["client"])
        if snap["extra"] is not None:
            written += _torch_save(snap["extra"], self.staging / EXTRA, size)
        self.buffers.release(snap["payload"])  # on disk: the next snapshot may copy into them
        self.snap = {"manifest": snap["manifest"]}
        return written

    def _note_failure(self, error: BaseException) -> None:
        with contextlib.suppress(OSError):  # best effort: rank 0 stops waiting for this rank's file at the note
            (self.staging / f"failed_{self.rank:05d}").write_text(str(error))

    def _wait_for_peers(self) -> None:
        needed = [rank_file(r) for r in range(self.saved_world)] + [client_file(r) for r in range(self.world)]
        deadline, delay = time.monotonic() + PEER_TIMEOUT_S, 0.005
        while True:
            failed = sorted(self.staging.glob("failed_*"))
            if failed:
                raise CheckpointError(f"{self.staging}: {failed[0].name.replace('failed_', 'rank ')} could not "
                                      f"write its file: {failed[0].read_text()}",
                                      "the previous checkpoint and `latest` are untouched")
            missing = [n for n in needed if not (self.staging / n).is_file()]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise CheckpointError(f"{self.staging}: {missing[0]} did not appear within {PEER_TIMEOUT_S:.0f} s",
                                      "a rank stopped writing; the previous checkpoint and `latest` are untouched")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def save_decoupled(engine: CheckpointView, root: Path, tag: str | None, client_state: dict[str, Any] | None,
                   save_latest: bool, exclude_frozen: bool = False) -> Path:
    """``save_checkpoint`` with the decoupled writer (or ``type: MOCK``); see the module docstring."""
    t0 = time.perf_counter()
    cfg = engine.config.checkpoint.writer
    rank = engine.ctx.rank
    writer = _writer_for(engine)
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    tag = save.check_tag(agreed_tag(engine.coll, rank, tag, engine.config.checkpoint.tag_validation))
    staging = save.staging_dir(root, tag)
    if cfg.type == "MOCK":
        warnings.warn("checkpoint.writer.type is mock: save_checkpoint writes nothing", stacklevel=3)
        return root / tag
    if staging in writer.pending_keys():  # the same tag is still being written: it goes first
        writer.wait()
    writer.wait_for_slot()
    errors = writer.take_errors()
    save.agree(engine, errors[0] if errors else None, "writing an earlier checkpoint in the background")

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            save.sweep_staging(root, keep=frozenset(k for k in writer.pending_keys() if isinstance(k, Path)))
            staging.mkdir()

    save.agree(engine, save._attempt(prepare), f"creating {staging}")
    buffers = _BUFFERS[engine]
    snap = _snapshot(engine, client_state, buffers, exclude_frozen)
    blocked = time.perf_counter() - t0
    job = _Job(root, tag, rank, engine.ctx.world_size, layout.saved_world(engine)[0], snap, save_latest, cfg, blocked,
               buffers)
    writer.submit(staging, job)
    return root / tag
