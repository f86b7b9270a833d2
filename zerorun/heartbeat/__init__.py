"""The rank's heartbeat: what it is doing, sent to its node's agent while it works.

The engine reports its phases, steps and collectives by itself; a script reports its own
with :func:`progress`. Without a launcher's channel (``python train.py``) nothing is sent
and these calls cost a few attribute stores.
"""

from __future__ import annotations

from zerorun.heartbeat.channel import start
from zerorun.heartbeat.state import PROGRESS

MAX_COUNTERS = 8


def progress(phase: str | None = None, *, step: int | None = None, **counters: float | int | str) -> None:
    """Tell the launcher this rank is making progress, and optionally where it is.

    ``phase``: a short name shown in the live view and in a stall verdict (``"eval"``,
    ``"data"``); it stays until the engine enters one of its own or the next call.
    ``step``: the script's own step count, for a loop the engine does not run (each new
    value is a step: its time goes into the live view's s/step and the summary).
    ``counters``: up to 8 numbers or short strings shown beside the rank (``loss=0.3``).
    Every call counts as progress, so a long phase of the script's own (an evaluation,
    a data pass) is not taken for a stall as long as it calls this now and then.

        zerorun.progress("eval", batch=i)
    """
    start()
    if phase is not None:
        PROGRESS.enter(str(phase)[:40])
    if step is not None and step > PROGRESS.step:
        PROGRESS.step_done(int(step))
    if counters:
        items = {str(k)[:32]: v if isinstance(v, int | float) else str(v)[:64] for k, v in counters.items()}
        PROGRESS.user = dict(list(items.items())[:MAX_COUNTERS])
    PROGRESS.beats += 1


__all__ = ["progress", "start"]
