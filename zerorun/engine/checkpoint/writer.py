"""The background writer of decoupled saves: one thread, a FIFO of at most ``slots`` jobs.

A thread, not a process. What it runs is file I/O (``torch.save`` into a buffered file,
``fsync``, ``rename``), and CPython releases the GIL in every ``write``/``fsync`` system
call, so the training thread keeps running while the bytes go out; the pickling that does
hold the GIL is the small structure around a few large flat tensors (each bucket's chunk
is one tensor). A process would need the snapshot copied into shared memory (or a pickle
pipe) and, forked, inherits gloo's and the allocator's threads in an undefined state;
spawned, it costs a Python and torch start-up. bench/checkpoint.py measures the step time
of the training thread while a write runs. (The thread keeps the process's priority: at
nice 10 the steps lost less time on a busy 2-core host, but the writes starved behind the
host's other processes, and a queued save then waits on them.)

Lifecycle: :meth:`submit` queues a job (blocking while ``slots`` jobs are queued or running:
the bound on snapshots held in memory), :meth:`wait` returns once every queued job is done,
:meth:`close` waits and stops the thread. An ``atexit`` hook closes it, so the process
exit waits for the last write; an engine teardown can call :meth:`close` first. The thread
is a daemon only so that a process killed by the interpreter's own shutdown of threads
(which joins non-daemon threads *before* ``atexit`` runs) cannot hang on an idle writer.
"""

from __future__ import annotations

import atexit
import collections
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum


class WriterState(Enum):
    """OPEN: accepts jobs. CLOSED: the thread has stopped; a submit is an error."""

    OPEN = "open"
    CLOSED = "closed"


@dataclass
class Job:
    """One unit of background work: ``run`` does it; ``key`` names it (a staging folder) while queued."""

    key: object
    run: Callable[[], None]
    done: threading.Event = field(default_factory=threading.Event)


class BackgroundWriter:
    """Runs jobs in order on one thread; at most ``slots`` jobs exist at once (queued or running)."""

    def __init__(self, slots: int, name: str = "zerorun-checkpoint-writer") -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.state = WriterState.OPEN
        self._jobs: collections.deque[Job] = collections.deque()  # the running job stays first until done
        self._errors: list[BaseException] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    # ---- the training thread's side -----------------------------------------------------------
    def pending_keys(self) -> list[object]:
        """Keys of the jobs queued or running, oldest first."""
        with self._cond:
            return [j.key for j in self._jobs]

    def submit(self, key: object, run: Callable[[], None]) -> None:
        """Queue ``run``; waits first while ``slots`` jobs exist (the memory bound)."""
        with self._cond:
            if self.state is not WriterState.OPEN:
                raise RuntimeError("the checkpoint writer is closed: no save can be queued after close()")
            self._cond.wait_for(lambda: len(self._jobs) < self.slots)
            self._jobs.append(Job(key, run))
            self._cond.notify_all()

    def wait_for_slot(self) -> None:
        """Return once fewer than ``slots`` jobs exist (a snapshot may then be taken)."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._jobs) < self.slots or self.state is WriterState.CLOSED)

    def wait(self) -> None:
        """Return once every queued job has finished (successfully or not)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._jobs)

    def take_errors(self) -> list[BaseException]:
        """The errors of finished jobs since the last call (and forget them)."""
        with self._cond:
            errors, self._errors = self._errors, []
            return errors

    def close(self) -> list[BaseException]:
        """Wait for every job, stop the thread; returns the errors not yet taken. Idempotent."""
        with self._cond:
            self._cond.wait_for(lambda: not self._jobs)
            self.state = WriterState.CLOSED
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        return self.take_errors()

    def _at_exit(self) -> None:
        for error in self.close():
            print(f"zerorun: a background checkpoint write failed: {error}", file=sys.stderr, flush=True)

    # ---- the writer thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs) or self.state is WriterState.CLOSED)
                if not self._jobs:
                    return
                job = self._jobs[0]
            try:
                job.run()
            except BaseException as e:  # kept for the training thread's next save, load or wait
                with self._cond:
                    self._errors.append(e)
            with self._cond:
                self._jobs.popleft()
                job.done.set()
                self._cond.notify_all()
            del job  # the snapshot it held is freed before the next one waits
