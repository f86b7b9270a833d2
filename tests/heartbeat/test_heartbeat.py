"""The rank's heartbeat (zerorun.heartbeat): one JSON line per interval on the descriptor its agent
gave it, zerorun.progress's phase, steps and counters in it, and nothing without a descriptor."""

from __future__ import annotations

import json
import os

import zerorun
from zerorun.heartbeat import channel
from zerorun.heartbeat.state import PROGRESS


def test_no_channel_no_heartbeat() -> None:
    assert channel.start({}) is None
    zerorun.progress("eval", batch=1)  # costs a few stores, sends nothing
    assert PROGRESS.phase == "eval" and PROGRESS.user == {"batch": 1}


def test_beats_carry_the_progress_and_the_descriptor_leaves_the_environment(monkeypatch) -> None:  # noqa: ANN001
    r, w = os.pipe()
    env = {channel.FD_ENV: str(w), channel.INTERVAL_ENV: "0.05"}
    monkeypatch.setattr(channel, "_CURRENT", None)
    hb = channel.start(env)
    try:
        assert hb is not None and channel.FD_ENV not in env and not os.get_inheritable(w)
        zerorun.progress("data", step=PROGRESS.step + 1, loss=0.25)
        with os.fdopen(r, "rb") as stream:
            for line in stream:
                beat = json.loads(line)
                if beat["phase"] == "data" and beat["steps"]:
                    break
        assert beat["v"] == 1 and beat["user"] == {"loss": 0.25} and beat["mem"]["rss"] > 0
        assert beat["steps"][-1][0] == PROGRESS.step and "stacks" not in beat  # no stack file given
    finally:
        hb.stopped.set()
        hb.thread.join(timeout=2)
        os.close(w)
