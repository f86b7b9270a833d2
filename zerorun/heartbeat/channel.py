"""The rank's end of the heartbeat: a daemon thread that writes one JSON line per interval
on a pipe its node's agent made for this rank alone, and Python stacks on request.

The agent passes the pipe's write end as an inherited file descriptor
(``ZERORUN_HEARTBEAT_FD``), never as a path, and reads the other end itself: what the rank
prints on stdout or stderr never reaches it, and the agent names the rank by the pipe, not by
anything a line says. The descriptors are taken out of the environment and made
non-inheritable at start, so the rank's own subprocesses do not write on them.

Stacks: faulthandler is registered on :data:`STACK_SIGNAL` to write every thread's Python
stack into a file the agent opened for this rank (``ZERORUN_STACKS_FD``). faulthandler dumps
from the signal handler in C, without the GIL, so a rank stuck in a collective, in C code or
in a Python loop answers alike. The first beat says ``"stacks": "signal"``; an agent sends the
signal only to a rank that said so (to any other it would be fatal).

A beat is at most :data:`MAX_BEAT` bytes, under the pipe's atomic-write size, and is
dropped, not waited for, when the pipe is full: the heartbeat never slows the rank.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from typing import IO

from zerorun.heartbeat.state import PROGRESS, Phase, Progress

FD_ENV = "ZERORUN_HEARTBEAT_FD"
STACKS_FD_ENV = "ZERORUN_STACKS_FD"
INTERVAL_ENV = "ZERORUN_HEARTBEAT_S"
OFF_ENV = "ZERORUN_HEARTBEAT"
STACK_SIGNAL = signal.SIGUSR2
MAX_BEAT = 3800
MAX_STEPS_PER_BEAT = 48
DEFAULT_INTERVAL_S = 1.0


def _proc_fields(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError), open(path) as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in keys:
                out[key] = int(value.split()[0])
    return out


def memory() -> dict[str, int]:
    """Bytes: resident set and its peak (host); allocated, reserved and peak on CUDA when in use."""
    status = _proc_fields("/proc/self/status", ("VmRSS", "VmHWM"))
    out = {"rss": status.get("VmRSS", 0) * 1024, "peak_rss": status.get("VmHWM", 0) * 1024}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        out.update(device_allocated=int(torch.cuda.memory_allocated()), device_reserved=int(torch.cuda.memory_reserved()),
                   device_peak=int(torch.cuda.max_memory_allocated()))
    return out


def io_bytes() -> int:
    """Bytes this process has read and written through system calls (files, pipes, sockets)."""
    io = _proc_fields("/proc/self/io", ("rchar", "wchar"))
    return io.get("rchar", 0) + io.get("wchar", 0)


def beat(progress: Progress, stacks: bool) -> dict[str, object]:
    """One heartbeat: a JSON-able sample of ``progress`` and of the process."""
    steps = progress.drain_steps()[-MAX_STEPS_PER_BEAT:]
    out: dict[str, object] = {
        "v": 1, "t": round(time.time(), 3), "phase": progress.phase, "phase_s": round(time.time() - progress.phase_since, 2),
        "step": progress.step, "micro": progress.micro_step, "seq": progress.seq,
        "issued": list(progress.issued) if progress.issued else None,
        "completed": list(progress.completed) if progress.completed else None,
        "label": progress.label, "wait_s": round(progress.wait_s, 4), "marks": progress.beats,
        "steps": [[s, round(t, 5), round(w, 5)] for s, t, w in steps],
        "mem": memory(), "io": io_bytes(),
        "samples_per_step": progress.samples_per_step, "tokens_per_sample": progress.tokens_per_sample,
        "user": dict(list(progress.user.items())[:8]),
    }
    if progress.order_ring:  # the order check's records (launcher.watch.order compares them)
        out["order"] = {"ring": [list(r) for r in list(progress.order_ring)],
                        "marks": [list(m) for m in sorted(set(list(progress.fingerprints.values())))]}
    if stacks:
        out["stacks"] = "signal"
    return out


class Heartbeat:
    """The sending thread of one process."""

    def __init__(self, fd: int, interval: float, stacks: IO[str] | None) -> None:
        self.fd = fd
        self.interval = interval
        self.stacks = stacks
        self.pid = os.getpid()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="zerorun-heartbeat", daemon=True)

    def send(self) -> bool:
        """Write one beat; False once the agent is gone (the thread then stops)."""
        data = (json.dumps(beat(PROGRESS, self.stacks is not None), separators=(",", ":")) + "\n").encode()
        if len(data) > MAX_BEAT:  # too many user counters or steps: send the essentials
            data = (json.dumps({**beat(PROGRESS, self.stacks is not None), "user": {}, "steps": []}) + "\n").encode()
        try:
            os.write(self.fd, data[:MAX_BEAT])
        except BlockingIOError:
            return True  # the pipe is full: this beat is dropped, the next one carries the state
        except OSError:
            return False
        return True

    def _run(self) -> None:
        while self.send() and not self.stopped.wait(self.interval):
            pass


_CURRENT: Heartbeat | None = None


def start(env: dict[str, str] | os._Environ[str] = os.environ) -> Heartbeat | None:
    """Start this process's heartbeat when its agent gave it a channel (once; None without one)."""
    global _CURRENT
    if _CURRENT is not None and _CURRENT.pid == os.getpid():
        return _CURRENT
    text = env.pop(FD_ENV, None)
    stacks_text = env.pop(STACKS_FD_ENV, None)
    if env.get(OFF_ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        return None  # ZERORUN_HEARTBEAT=0: no heartbeat thread (the overhead benchmark's baseline)
    if not text or not text.isdigit():
        return None
    fd = int(text)
    try:
        os.set_inheritable(fd, False)
        os.set_blocking(fd, False)
    except OSError:  # not a descriptor of ours (a stale variable): no heartbeat
        return None
    stacks = _register_stacks(stacks_text)
    interval = float(env.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    _CURRENT = Heartbeat(fd, max(0.05, interval), stacks)
    _CURRENT.thread.start()
    atexit.register(_CURRENT.send)  # the last steps reach the launcher, not only those of the last interval
    return _CURRENT


def stop(timeout: float = 1.0) -> None:
    """Stop this process's sending thread (at exit, after the engine's teardown); the beats sent at
    exit itself (:func:`exiting`, the last one) are written by the exiting thread, not by it."""
    current = _CURRENT
    if current is None or current.pid != os.getpid() or not current.thread.is_alive():
        return
    current.stopped.set()
    current.thread.join(timeout)  # it waits on the event: it wakes at once (a beat in progress ends first)


def exiting() -> None:
    """From here the process winds down (groups destroyed, interpreter torn down): say so at once.

    Called where the engine registers its own exit work, so this runs before it (atexit
    runs last-registered first); the launcher gives a rank that is exiting the set-up
    allowance, not the stall timeout.
    """
    atexit.register(say_exiting)


def say_exiting() -> None:
    """Tell the launcher now that this rank's script has ended (the summary then tells a failure at
    exit from one in training); the engine's exit path says it too, whoever created the group."""
    # an uncaught exception sets sys.last_value before atexit runs: then the script did not finish
    PROGRESS.enter(Phase.EXITING_AFTER_ERROR if getattr(sys, "last_value", None) is not None else Phase.EXITING)
    if _CURRENT is not None and _CURRENT.pid == os.getpid():
        _CURRENT.send()


def _register_stacks(text: str | None) -> IO[str] | None:
    if not text or not text.isdigit():
        return None
    try:
        os.set_inheritable(int(text), False)
        stream = os.fdopen(int(text), "w")
        faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return None
    return stream
