"""The collective-order check, on by default: the ranks' rings and fingerprints compared by the launcher."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, zerorun_argv

from launcher.watch.heartbeats import Board
from launcher.watch.order import ORDER_EXIT, OrderWatch
from zerorun.heartbeat.channel import beat
from zerorun.heartbeat.state import Progress, name_code


def _progress(records: list[tuple[str, int, str]]) -> Progress:
    p = Progress(record_order=True)
    for seq, (kind, numel, dtype) in enumerate(records, 1):
        p.note_issue(seq, kind, numel, dtype)
    return p


def _watch(*progresses: Progress) -> tuple[OrderWatch, Board]:
    board, watch = Board(len(progresses), 0.0), OrderWatch()
    board.started(0, "h", {str(r): r + 1 for r in range(len(progresses))}, 0.0)
    for r, p in enumerate(progresses):
        board.on_beat(r, beat(p, False), 1.0)
        watch.take(r, board.ranks[r].beat or {})
    return watch, board


STEP = [("reduce_scatter", 4096, "fp32"), ("all_reduce", 1, "fp32"), ("all_gather", 8192, "bf16")]


def test_the_same_collectives_agree_and_a_different_one_is_named() -> None:
    same, board = _watch(_progress(STEP * 10), _progress(STEP * 10))
    assert same.mismatch(board) is None
    other = STEP * 9 + [("all_gather", 8192, "bf16"), ("all_reduce", 1, "fp32"), ("all_gather", 8192, "bf16")]
    watch, board = _watch(_progress(STEP * 10), _progress(STEP * 10), _progress(other))
    assert watch.mismatch(board) == ("rank 2 issued all_gather(8192 bf16) as #28 where ranks 0,1 issued "
                                     "reduce_scatter(4096 fp32)")


def test_a_difference_older_than_the_ring_is_found_by_the_fingerprints() -> None:
    swapped = STEP * 10 + STEP[::-1] + STEP * 30  # two collectives in another order, long ago; the same since
    watch, board = _watch(_progress(STEP * 41), _progress(swapped))
    assert _ring_of(board, 0) == _ring_of(board, 1)  # the last records agree
    text = watch.mismatch(board)
    assert text is not None and "rank 1 issued other collectives than rank 0 before #" in text, text


def _ring_of(board: Board, rank: int) -> list:
    return (board.ranks[rank].beat or {})["order"]["ring"]


def test_a_rank_that_has_not_got_there_is_not_compared_and_the_ring_can_be_off(monkeypatch: pytest.MonkeyPatch) -> None:
    watch, board = _watch(_progress(STEP * 10), _progress(STEP * 9))  # rank 1 behind: nothing in common differs
    assert watch.mismatch(board) is None
    monkeypatch.setenv("ZERORUN_ORDER_RING", "0")
    off = Progress()
    off.note_issue(1, "all_reduce", 1, "fp32")
    assert not off.order_ring and "order" not in beat(off, False)
    assert name_code("all_gather") == name_code("all_gather") != name_code("all_reduce")


def test_the_beat_stays_small() -> None:
    from zerorun.heartbeat.channel import MAX_BEAT

    p = _progress(STEP * 20000)
    p.note_issue(10**9, "all_gather_object", 0, "uint8")
    import json

    assert len(json.dumps(beat(p, True))) < MAX_BEAT


@pytest.mark.timeout(150)
def test_a_rank_that_skips_a_collective_is_named_by_the_order_check(tmp_path: Path) -> None:
    argv = zerorun_argv("--num_gpus", "2", "--master_port", "auto", "--stall_timeout", "60", "--kill_timeout", "3",
                        "--env", "ZERORUN_SHARED_MEMORY=0", "--env", "ZERORUN_HEARTBEAT_S=0.5",
                        str(SCRIPTS / "stall_cases.py"), "--skip_rank", "1")
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=140)
    assert proc.returncode == ORDER_EXIT, proc.stderr[-3000:]
    assert "zerorun: collective order differs between ranks: rank 1 issued all_reduce(" in proc.stderr, proc.stderr
    assert "where rank 0 issued reduce_scatter(" in proc.stderr and "stalled" not in proc.stderr
