"""Collectives between ranks on one host through shared memory (the gloo path's fast lane).

gloo moves every byte through loopback TCP: a send and a receive copy through the
kernel per chunk, on the cores the ranks compute on. Ranks that share a host can read
each other's memory instead. Each rank maps one segment per rank (its own and every
peer's, files under ``/dev/shm`` unlinked once all are mapped) holding a header of
counters and :data:`SLOTS` slots of ``slot_bytes``:

* a collective is cut into *pieces* that fit a slot (a reduce-scatter: the same stretch
  of every rank's chunk; an all-gather: a stretch of the rank's own chunk; an all-reduce:
  a stretch of the buffer), and each piece gets the next sequence number ``s`` (every
  rank issues the engine's collectives in the same order, as gloo's require); at *post*
  the rank copies into slot ``s % SLOTS`` what peers will read of the piece (the peers'
  stretches, its own, or all of it), writes the slot's descriptor (``s``, the kind, the
  collective's element count, the dtype) and publishes ``posted = s``;
* at *complete* it waits until every peer has posted ``s``, checks that every peer's
  descriptor is its own (else :class:`CollectiveMismatch` names both: ranks that issue
  collectives in different orders fail, never sum unrelated buffers), reads their slots (adds
  the peers' copies of its chunk, copies their chunks, or sums every rank's buffer in
  rank order, so every rank holds the same bits) and publishes ``done = s``;
* a slot is reused only when every peer's ``done`` shows it has read the slot's last
  contents; a rank short of slots first completes its own oldest pieces (which only
  need posts peers have made), so no two ranks can wait on each other. A collective of
  more pieces than :data:`SLOTS` is thus a pipeline: issuing it exchanges all but its
  last pieces (every peer issues it too), waiting for it completes the rest.

Per collective a rank copies once in and reads once out, with no kernel involved (2
ranks, an 8 MB fp32 bucket: reduce-scatter 1.2 ms against 5.1 for the point-to-point
exchange, all-gather 1.4 against 3.4, all-reduce 3.2 against gloo's 7.1). Completion
runs on the waiting thread, where gloo's ran on its own threads.

The lane's footprint is bounded by :data:`LANE_BYTES`, whatever the buckets: the pages
a rank touches (its own segment, the parts of its peers' it reads) count in its
resident set, so slots are sized ``LANE_BYTES / (SLOTS * world)`` (or the largest
bucket, when smaller) and a rank maps at most ``LANE_BYTES`` of lane in all. Slots of
one bucket each (16 MiB) cost 64-100 MiB per rank at world 2-4. Pieces are no slower:
each is still one copy in and one read out, the counters are read through ctypes (well
under a microsecond a piece), and a piece stays in cache between its copy and its read
(2 ranks, a 16 MiB fp32 bucket, median of 15: reduce-scatter 0.8-1.0 ms in 2 MiB pieces
against 1.4-1.5 in one slot, all-gather 1.1 against 1.4-1.6, all-reduce 1.8-2.2 against
3.3-3.7; 4 ranks, 1 MiB pieces: 4.3-5.0 against 4.3-4.7, 1.9-2.6 against 2.8-2.9,
8.6-9.7 against 10.8-12.3). The budget was 16 MiB and is 8 (1 MiB pieces at world 2): the
stage-3 memory benchmark's peak is 8 MiB lower per rank, and stages 2 and 3 stepped no slower
(issue 48, measured with the change to landed gradients: BENCHMARKS.md).

Ordering relies on x86's total store order (data written before the counter that
publishes it is seen in that order by a peer that reads the counter first), so the
lane is only used on x86-64; elsewhere, across hosts, for a non-contiguous tensor or a
dtype it does not know, or with ``ZERORUN_SHARED_MEMORY=0``, collectives take the
point-to-point path.
"""

from __future__ import annotations

import ctypes
import os
import platform
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from zerorun.engine.comm.sums import sum_chunks
from zerorun.errors import ZerorunError

SLOTS = 4
# every segment a rank maps, its own and its peers': 8 MiB (1 MiB slots at world 2, 512 KiB at 4)
LANE_BYTES = 8 * 2**20
MIN_SLOT_BYTES = 64 * 2**10  # below this a piece's fixed cost (counters, descriptor) dominates its copy
ENV_SWITCH = "ZERORUN_SHARED_MEMORY"
_POSTED, _DONE, _PID = 0, 1, 2  # int64 counters at the head of a segment
_DESCRIPTORS = 8  # then, from this int64 on, one descriptor per slot: sequence, kind, elements, dtype
_FIELDS = 4
HEADER_BYTES = 8 * (_DESCRIPTORS + SLOTS * _FIELDS)  # 192: slots start 64-byte aligned
SHM_DIR = Path("/dev/shm")
WAIT_TIMEOUT_S = 1800.0  # torch.distributed's default collective timeout (the group's is passed in)
KIND_CODES = {"reduce_scatter": 1, "all_gather": 2, "all_reduce": 3}
DTYPE_CODES = {dt: i + 1 for i, dt in enumerate(
    (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.int8))}
_SPINS_BEFORE_SLEEP = 200


class PeerLost(ZerorunError, RuntimeError):
    """A peer rank stopped taking part (it exited, or did not post within the timeout).

    A consequence, never the cause: it is shown as zerorun's own error (one line and the
    hint, no traceback unless ZERORUN_DEBUG), pointing at the rank that stopped first."""

    def __init__(self, message: str,
                 hint: str = "the rank that stopped first is the root cause: its own error is above") -> None:
        super().__init__(message, hint)


class CollectiveMismatch(RuntimeError):
    """Two ranks issued different collectives as the same one (a different order or size)."""


def describe(descriptor: tuple[int, int, int, int]) -> str:
    """``(sequence, kind, elements, dtype)`` in words: ``all_reduce #7 of 100 float32``."""
    seq, kind, numel, dtype = descriptor
    kinds = {v: k for k, v in KIND_CODES.items()}
    dtypes = {v: str(k).removeprefix("torch.") for k, v in DTYPE_CODES.items()}
    return f"{kinds.get(kind, f'kind {kind}')} #{seq} of {numel} {dtypes.get(dtype, f'dtype {dtype}')}"


def host_identity() -> str:
    """What ranks compare to know they share memory: the host name and the kernel's boot id."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def lane_supported() -> bool:
    """Whether this process may use the lane at all (before asking the peers)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return platform.machine().lower() in ("x86_64", "amd64") and SHM_DIR.is_dir()


def new_token() -> str:
    return secrets.token_hex(8)


def segment_path(token: str, rank: int) -> Path:
    return SHM_DIR / f"zerorun-lane-{token}-{rank}"


def segment_bytes(slot_bytes: int) -> int:
    return HEADER_BYTES + SLOTS * slot_bytes


def _region(reader: int, poster: int) -> int:
    """Where ``reader``'s stretch sits in ``poster``'s reduce-scatter slot: the poster's peers in rank order."""
    return reader if reader < poster else reader - 1


def slot_bytes_for(largest_bytes: int, world_size: int) -> int:
    """The slot size for collectives of up to ``largest_bytes`` among ``world_size`` ranks: every
    segment together within :data:`LANE_BYTES`, never below :data:`MIN_SLOT_BYTES` (nor larger
    than the largest collective); a multiple of 64 bytes that holds a fp64 element per rank."""
    budget = max(MIN_SLOT_BYTES, LANE_BYTES // (SLOTS * world_size))
    size = max(min(largest_bytes, budget), 8 * world_size)
    return -(-size // 64) * 64


def create_segment(token: str, rank: int, slot_bytes: int) -> torch.Tensor:
    """This rank's segment, zeroed (posted = done = 0), with its pid in the header.

    The pages are reserved up front: a full ``/dev/shm`` (containers often give it 64 MB)
    fails here with an ``OSError``, not later with a SIGBUS on first touch.
    """
    path, size = segment_path(token, rank), segment_bytes(slot_bytes)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)  # a name that exists: not ours
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        seg = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
    except BaseException:  # created here, so removed here: the caller never learns its name was taken
        path.unlink(missing_ok=True)
        raise
    header = seg[:HEADER_BYTES].view(torch.int64)
    header.zero_()
    header[_PID] = os.getpid()
    return seg


def open_segment(token: str, rank: int, slot_bytes: int) -> torch.Tensor:
    """A peer's segment; an ``OSError`` when it is missing, or its owner is not a process this one
    can see (another pid namespace: the liveness check could not tell a dead peer)."""
    path = segment_path(token, rank)
    if path.stat().st_size != segment_bytes(slot_bytes):
        raise OSError(f"{path} has the wrong size")
    seg = torch.from_file(str(path), shared=True, size=segment_bytes(slot_bytes), dtype=torch.uint8)
    pid = int(seg[:HEADER_BYTES].view(torch.int64)[_PID])
    if not process_alive(pid):
        raise OSError(f"the owner of {path} (pid {pid}) is not a live process here")
    return seg


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


class SharedLane:
    """The shared-memory collectives of one process group (see the module docstring)."""

    def __init__(self, segments: list[torch.Tensor], rank: int, slot_bytes: int,
                 timeout_s: float = WAIT_TIMEOUT_S) -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        self.world_size = len(segments)
        self.slot_bytes = slot_bytes
        self.segments = segments  # the header views below point into them: keep them alive
        # the counters through ctypes: a plain 8-byte load or store each, ~10x cheaper than a tensor's
        self.headers = [(ctypes.c_int64 * (HEADER_BYTES // 8)).from_address(s.data_ptr()) for s in segments]
        self.slots = [[s[HEADER_BYTES + i * slot_bytes: HEADER_BYTES + (i + 1) * slot_bytes] for i in range(SLOTS)]
                      for s in segments]
        self.peers = [p for p in range(self.world_size) if p != rank]
        self.seq = 0  # the last piece issued
        self.pending: deque[tuple[int, Callable[[], None]]] = deque()
        # more ranks than cores: a spinning rank would take the core the awaited peer needs
        self.spins = _SPINS_BEFORE_SLEEP if self.world_size <= _usable_cores() else 0

    def close(self) -> None:
        """Complete what is pending (the peers posted it: every rank issues the same collectives) and
        drop this rank's mappings. A peer's reads of this rank's segment go through its own mapping,
        so closing never pulls pages from under a peer still finishing."""
        if self.pending:
            self.complete_through(self.pending[-1][0])
        self.headers, self.slots, self.segments = [], [], []

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether the lane can carry ``tensor`` (any size: a large one goes in slot-sized pieces)."""
        return tensor.is_contiguous() and tensor.dtype in DTYPE_CODES

    # ---- the three collectives: what each piece posts, and what completing it does -------------
    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor | None = None, scale: float = 1.0) -> int:
        """Piece ``[start, start + n)`` of every chunk: the poster's slot holds one region per peer, in
        rank order (none for its own chunk, so a piece is as large as the slot allows: at world 2 the
        whole slot). The sum lands in this rank's chunk of ``flat``, or in ``out`` (a chunk-sized
        tensor) when given, times ``scale`` (piece by piece, while each is in cache)."""
        size = flat.numel() // self.world_size
        piece = max(1, self.slot_bytes // ((self.world_size - 1) * flat.element_size()))
        mine = flat.narrow(0, self.rank * size, size)
        target = mine if out is None else out

        def post(slot: torch.Tensor, start: int, n: int) -> None:
            for k, p in enumerate(self.peers):  # peers read only their own chunk's stretch of this rank's buffer
                slot.narrow(0, k * piece, n).copy_(flat.narrow(0, p * size + start, n))

        def complete(seq: int, start: int, n: int) -> None:
            sum_chunks(target.narrow(0, start, n), mine.narrow(0, start, n),
                       [self._slot_of(p, seq, flat.dtype).narrow(0, _region(self.rank, p) * piece, n)
                        for p in self.peers], scale)

        return self._pieces("reduce_scatter", flat, size, piece, post, complete)

    def all_gather(self, flat: torch.Tensor) -> int:
        size = flat.numel() // self.world_size
        piece = max(1, self.slot_bytes // flat.element_size())
        mine = flat.narrow(0, self.rank * size, size)

        def post(slot: torch.Tensor, start: int, n: int) -> None:
            slot.narrow(0, 0, n).copy_(mine.narrow(0, start, n))

        def complete(seq: int, start: int, n: int) -> None:
            for p in self.peers:
                flat.narrow(0, p * size + start, n).copy_(self._slot_of(p, seq, flat.dtype).narrow(0, 0, n))

        return self._pieces("all_gather", flat, size, piece, post, complete)

    def all_reduce(self, flat: torch.Tensor) -> int:
        """Sum in place; every rank adds the same buffers in rank order, so all hold the same bits."""
        whole = flat.reshape(-1)
        piece = max(1, self.slot_bytes // flat.element_size())

        def post(slot: torch.Tensor, start: int, n: int) -> None:
            slot.narrow(0, 0, n).copy_(whole.narrow(0, start, n))

        def complete(seq: int, start: int, n: int) -> None:
            parts = [self._slot_of(p, seq, flat.dtype).narrow(0, 0, n) for p in range(self.world_size)]
            sum_chunks(whole.narrow(0, start, n), parts[0], parts[1:])

        return self._pieces("all_reduce", flat, whole.numel(), piece, post, complete)

    def _pieces(self, kind: str, flat: torch.Tensor, total: int, piece: int,
                post: Callable[[torch.Tensor, int, int], None], complete: Callable[[int, int, int], None]) -> int:
        """Issue ``total`` elements in pieces of ``piece``: ``post(slot, start, n)`` fills this rank's
        slot, ``complete(seq, start, n)`` reads the peers'; the last piece's sequence number."""
        for start in range(0, total, piece):
            n = min(piece, total - start)
            seq, slot = self._post(kind, flat)
            post(slot, start, n)
            self._publish(seq, partial(complete, seq, start, n))
        return self.seq

    # ---- sequencing ------------------------------------------------------------------------------
    def _slot_of(self, rank: int, seq: int, dtype: torch.dtype) -> torch.Tensor:
        return self.slots[rank][seq % SLOTS].view(dtype)

    def _descriptor(self, rank: int, seq: int) -> tuple[int, ...]:
        start = _DESCRIPTORS + (seq % SLOTS) * _FIELDS
        return tuple(self.headers[rank][start:start + _FIELDS])

    def _post(self, kind: str, flat: torch.Tensor) -> tuple[int, torch.Tensor]:
        """The next piece's sequence number and this rank's slot for it, once every peer has read it;
        the slot's descriptor says what this rank posts there (checked by every reader): the
        collective's kind, its element count (not the piece's) and its dtype."""
        seq = self.seq + 1
        reuse = seq - SLOTS  # the collective that last used this slot
        if reuse > 0:
            self.complete_through(reuse)  # our own reads of that round come first
            self._await(lambda: all(self.headers[p][_DONE] >= reuse for p in self.peers),
                        f"to finish reading collective {reuse}")
        self.seq = seq
        start = _DESCRIPTORS + (seq % SLOTS) * _FIELDS
        self.headers[self.rank][start:start + _FIELDS] = (seq, KIND_CODES[kind], flat.numel(), DTYPE_CODES[flat.dtype])
        return seq, self._slot_of(self.rank, seq, flat.dtype)

    def _publish(self, seq: int, complete: Callable[[], None]) -> int:
        self.headers[self.rank][_POSTED] = seq
        self.pending.append((seq, complete))
        return seq

    def posted_by_all(self, seq: int) -> bool:
        """Whether every peer has posted every piece up to ``seq`` (completing them would not wait)."""
        return all(self.headers[p][_POSTED] >= seq for p in self.peers)

    def complete_through(self, seq: int) -> None:
        """Complete, in order, every piece issued up to ``seq``."""
        while self.pending and self.pending[0][0] <= seq:
            s, complete = self.pending[0]
            self._await(lambda s=s: self.posted_by_all(s),
                        f"to post collective {s}")
            self._check_descriptors(s)
            complete()
            self.pending.popleft()
            self.headers[self.rank][_DONE] = s

    def _check_descriptors(self, seq: int) -> None:
        """Every peer posted the same collective as this rank's ``seq``: gloo would raise or hang on
        a different order, and summing the slots of two different collectives is a wrong result."""
        mine = self._descriptor(self.rank, seq)
        for p in self.peers:
            theirs = self._descriptor(p, seq)
            if theirs != mine:
                raise CollectiveMismatch(
                    f"[rank {self.rank}] collective mismatch: this rank issued {describe(mine)}, rank {p} issued "
                    f"{describe(theirs)} (hint: every rank must issue the same collectives in the same order; "
                    "a rank that skips or reorders a bucket, or builds a different model, does this)")

    def _await(self, ready: Callable[[], bool], what: str) -> None:
        """Spin briefly, then sleep in growing steps (the peers need these cores), until ``ready``."""
        spins = 0
        deadline = None
        nap = 1e-5
        while not ready():
            spins += 1
            if spins < self.spins:
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.timeout_s
            elif spins % 256 == 0:
                self._check_peers(what, now > deadline)
            time.sleep(nap)
            nap = min(nap * 2, 2e-4)

    def _check_peers(self, what: str, timed_out: bool) -> None:
        for p in self.peers:
            pid = self.headers[p][_PID]
            if not process_alive(pid):
                raise PeerLost(f"[rank {self.rank}] rank {p} (pid {pid}) exited while this rank waited for it "
                               f"{what}")
        if timed_out:
            raise PeerLost(f"[rank {self.rank}] waited {self.timeout_s:.0f} s (the process group's timeout) "
                           f"for the peers {what}")
