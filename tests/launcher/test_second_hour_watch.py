"""The live view's headline and the summary of a resumed run, on synthetic beats."""

from __future__ import annotations

from launcher.watch.heartbeats import Board
from launcher.watch.liveview import headline
from launcher.watch.summary import summary


def test_the_headline_is_the_furthest_ranks_step() -> None:
    b = Board(2, started_at=0.0)
    b.started(0, "a", {"0": 1, "1": 2}, 0.0)
    b.on_beat(0, {"step": 55, "steps": [[55, 0.04, 0.0]]}, 5.0)
    b.on_beat(1, {"step": 42, "steps": [[42, 0.04, 0.0]]}, 5.0)  # its last beat left 13 steps earlier
    assert "| step 55 |" in headline(b, 6.0)


def test_a_resumed_run_counts_the_steps_it_ran() -> None:
    b = Board(1, started_at=0.0)
    b.started(0, "a", {"0": 1}, 0.0)
    b.on_beat(0, {"step": 10}, 1.0)  # loaded a checkpoint of step 10
    b.on_beat(0, {"step": 13, "steps": [[11, 0.1, 0.0], [12, 0.1, 0.0], [13, 0.1, 0.0]]}, 2.0)
    b.on_exit(0, 0, 3.0)
    text = summary(b, 3.0, 0, [], None)
    assert "3 step(s) (to global step 13), exit code 0" in text, text
    assert text.splitlines()[3].split()[2] == "3", text  # the rank's row: steps run
