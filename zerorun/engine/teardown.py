"""How an engine shuts down: ``engine.destroy()``, and the same at interpreter exit for every engine a
script never destroyed.

Why it matters: a C++ thread that needs the GIL after the interpreter has begun to finalize is
stopped by Python mid-destructor, and the rank aborts ("terminate called without an active
exception", exit -6) after training finished. gloo's worker threads are such threads: each frees
the work it ran, and freeing a work that holds a Python object (a tensor Python dropped meanwhile,
backward's thread-local context) takes the GIL. So nothing the engine started may still be running,
or be freed by another thread, once ``main()`` has returned.

``destroy(engine)``, in this order (each step waits only for what the steps before it left, so it
cannot deadlock):

1. settle: wait for every collective the engine issued and has not waited for yet (gradient
   reductions, stage-3 prefetches), and complete the shared-memory lane's pending pieces;
2. detach: remove the engine's gradient and gather hooks (the module is a plain module again);
3. release: close the offload swapper (its threads joined, its swap files removed) and the lane
   (its shared-memory mappings dropped).

The process group is left alone, as DeepSpeed's ``destroy`` leaves it: the script (or the Hugging
Face Trainer, which destroys the engine through accelerate's ``free_memory``) may go on using
torch.distributed afterwards. A group the user created stays the user's to destroy.

At exit (one ``atexit`` handler per process, holding live engines by weak reference) the handler
destroys every live engine without blocking on a collective that is not complete (a script that
exits on an error must not hang here), stops the heartbeat after its last beat, destroys the group
zerorun created (never a user's), and drops the engines' references to their groups, so that the
groups, and gloo's threads with them, are joined and freed while the interpreter is still whole.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from zerorun.engine.checkpoint.decoupled import flush_writes

if TYPE_CHECKING:
    from zerorun.engine.build import Parts
    from zerorun.engine.comm.collectives import Collectives, Pending

EXIT_SETTLE_S = 5.0
"""At exit, how long a collective still in flight is given to complete (then it is left)."""


class Tearable(Protocol):
    """What teardown reads of an engine (:class:`zerorun.engine.engine.Engine`)."""

    parts: Parts
    coll: Collectives


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_REGISTERED_PID: int | None = None
_DONE_ATTR = "_zerorun_destroyed"


def track(engine: Tearable) -> None:
    """Remember ``engine`` (weakly) for the exit path; the first call of a process registers it."""
    global _REGISTERED_PID
    _LIVE.add(engine)
    if os.getpid() != _REGISTERED_PID:  # once per process (a forked child registers its own)
        _REGISTERED_PID = os.getpid()
        atexit.register(at_exit)


def collectives_of(engine: Tearable) -> list[Any]:
    """Every :class:`~zerorun.engine.comm.collectives.Collectives` the engine uses (world and subgroups)."""
    found = [engine.coll]
    groups = getattr(engine.parts, "groups", None)
    if groups is not None:
        found += list(groups.by_name().values())
    out: list[Any] = []
    for c in found:
        if c is not None and all(c is not o for o in out):
            out.append(c)
    return out


def destroy(engine: Tearable, block: bool = True) -> None:
    """Finish and release what ``engine`` started (idempotent). ``block=False`` (the exit path): a
    collective that does not complete within :data:`EXIT_SETTLE_S` is left, never waited for."""
    if getattr(engine, _DONE_ATTR, False):
        return
    object.__setattr__(engine, _DONE_ATTR, True)  # kept in _LIVE: exit still drops its group references
    try:
        settle(engine, block)
        flush_writes(engine)  # a decoupled save's writer finishes its files (it needs no collective)
    finally:
        detach(engine)
        release(engine)


def settle(engine: Tearable, block: bool = True) -> None:
    """Wait for the collectives in flight: the gradient reductions, the stage-3 gathers, the lane's pieces."""
    parts = engine.parts
    inflight = getattr(parts.grad_sync, "inflight", None)
    while inflight:
        if not _ready(inflight[0], block):
            break
        inflight.popleft().wait()
    for bucket in [*parts.buckets, *getattr(parts, "frozen", [])]:
        pending = getattr(bucket, "_pending", None)  # a stage-3 gather in flight (a prefetch)
        if pending is not None and _ready(pending, block):
            bucket.wait()  # IN_FLIGHT -> GATHERED, as the bucket's own waiters leave it
    for coll in collectives_of(engine):
        lane = getattr(coll, "lane", None)
        if lane is not None and lane.pending:
            last = lane.pending[-1][0]
            if block or _poll(lambda lane=lane, last=last: lane.posted_by_all(last)):
                lane.complete_through(last)


def _ready(pending: Pending, block: bool) -> bool:
    """Whether to wait for ``pending``: always when blocking, else if it completes within
    :data:`EXIT_SETTLE_S` (a peer that already failed never completes it)."""
    return block or _poll(pending.ready)


def _poll(ready: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + EXIT_SETTLE_S
    nap = 1e-4
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(nap)  # the GIL released: gloo's threads finish what they run
        nap = min(nap * 2, 0.01)
    return True


def detach(engine: Tearable) -> None:
    """Remove the engine's gradient and gather hooks."""
    parts = engine.parts
    for handle in parts.hooks:
        handle.remove()
    parts.hooks.clear()
    for handle in getattr(parts.coordinator, "handles", []):
        handle.remove()


def release(engine: Tearable) -> None:
    """Close the offload (swap threads, swap files) and the shared-memory lane."""
    parts = engine.parts
    for owner in (parts.masters, getattr(parts, "param_offload", None)):
        close = getattr(owner, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):  # one failed close must not leave the rest open
                close()
    for coll in collectives_of(engine):
        lane = getattr(coll, "lane", None)
        if lane is not None:
            coll.lane = None  # this engine's collectives are over: its mappings go with it
            lane.close()


def at_exit() -> None:
    """The exit path (``atexit``): every live engine destroyed, the heartbeat's last beat sent and its
    thread stopped, zerorun's own group destroyed, and the groups' gloo threads joined."""
    from zerorun import heartbeat
    from zerorun.engine.comm import bootstrap

    if os.getpid() != _REGISTERED_PID:  # a forked child that never built an engine: not its engines
        return
    heartbeat.channel.say_exiting()
    engines = list(_LIVE)
    for engine in engines:
        with contextlib.suppress(Exception):  # exiting: a failure here must not hide the script's own
            destroy(engine, block=False)
    heartbeat.channel.stop()
    quiesce()  # before any group is freed: see quiesce (the free joins gloo's workers with the GIL held)
    if bootstrap.owns_group():
        bootstrap.destroy_group()
    for engine in engines:
        forget_groups(engine)
    del engines
    gc.collect()  # engines in reference cycles go now, and the groups they held with them
    quiesce()  # a group still alive (the script's own): its threads finish what they run first


QUIESCE_S = 1.0
"""At exit, how long gloo's threads of a group still alive are given to go idle."""


def backend_threads() -> list[str]:
    """The ids of this process's gloo worker threads (Linux; empty elsewhere). torch names them
    ``pt_gloo...`` (2.13 does, 2.6.0 does not); where none is named so (an older torch), every native thread that is
    no Python thread and carries the process's own name (unnamed) is taken for one: waiting on an
    idle OpenMP worker too costs nothing, missing a gloo worker is the exit hang."""
    tasks = "/proc/self/task"
    names: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(tasks):
            with contextlib.suppress(OSError), open(f"{tasks}/{tid}/comm") as f:
                names[tid] = f.read().strip()
    return pick_backend_threads(names, {str(t.native_id) for t in threading.enumerate()}, str(os.getpid()))


def pick_backend_threads(names: dict[str, str], python: set[str], pid: str) -> list[str]:
    """Of ``names`` (thread id -> name), gloo's workers: the ``pt_gloo`` ones, else (no thread named so)
    the unnamed native ones (the process's own name, not in ``python``)."""
    gloo = [tid for tid, name in names.items() if name.startswith("pt_gloo")]
    return gloo or [tid for tid, name in names.items() if tid not in python and name == names.get(pid, "")]


def _running(tid: str) -> bool:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "R"
    except OSError:
        return False  # gone


@functools.cache
def _thread_state_api() -> Any:
    """The C-API calls that walk the interpreter's thread states, typed once (quiesce polls every 2 ms)."""
    import ctypes

    api = ctypes.pythonapi
    api.PyInterpreterState_Main.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    return api


def foreign_thread_states() -> int:
    """How many of this interpreter's thread states belong to no Python thread: a C++ thread inside a
    GIL acquisition (a gloo worker freeing a finished work's tensors waits for the GIL with one)."""
    api = _thread_state_api()
    count = 0
    state = api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Main())  # walked with the GIL held
    while state:
        count += 1
        state = api.PyThreadState_Next(state)
    return max(0, count - len(threading._active))  # type: ignore[attr-defined]  # started Python threads


def quiesce(limit_s: float = QUIESCE_S) -> bool:
    """Release the GIL until gloo's worker threads are all asleep and no foreign thread holds a thread
    state, twice in a row, at most ``limit_s``; True when they went idle (or there are none).

    A gloo worker frees the work it ran after the caller's wait returned, and freeing a work whose
    tensors Python made takes the GIL. Freeing a gloo group joins its workers, with the GIL held
    when Python drops the last reference: a worker still waiting to free its last work then waits
    forever (a hang seen with torch's DDP, whose reducer frees its group so). So the exit path calls
    this before it frees a group, and again before the interpreter finalizes (where such a worker
    aborts the rank). A worker waiting for the GIL sleeps too, hence the thread-state count."""
    tids = backend_threads()
    deadline = time.monotonic() + limit_s
    quiet = 0
    while tids and quiet < 2:
        time.sleep(0.002)
        idle = not any(_running(t) for t in tids) and foreign_thread_states() == 0
        quiet = quiet + 1 if idle else 0
        if time.monotonic() > deadline:
            return False
    return True


def forget_groups(engine: Tearable) -> None:
    """Drop the engine's references to its process groups (at exit only: the engine is done), so a
    destroyed group is freed, and its threads joined, before the interpreter finalizes."""
    for coll in collectives_of(engine):
        coll.group = None
        coll.order = None
    ctx = getattr(engine, "ctx", None)
    if ctx is not None and getattr(ctx, "group", None) is not None:
        object.__setattr__(ctx, "group", None)  # a frozen dataclass: the one field exit may clear
