"""launcher.watch.raised: the exception line and the raising frame of a rank's stderr tail."""

from __future__ import annotations

from launcher.args import parse_args
from launcher.watch.raised import raised
from launcher.watch.report import Failure, format_report

TRACEBACK = [
    "[h:1] [rank1]: Traceback (most recent call last):",
    '[h:1] [rank1]:   File "train.py", line 30, in <module>',
    "[h:1] [rank1]:     main()",
    '[h:1] [rank1]:   File "/venv/lib/python3.12/site-packages/lib.py", line 7, in step',
    "[h:1] [rank1]:     raise RuntimeError('shapes differ: 3 vs 4')",
    "[h:1] [rank1]:     ^^^^^^^^^^^^^^^^",
    "[h:1] [rank1]: RuntimeError: shapes differ: 3 vs 4",
]


def test_the_exception_line_and_the_frame_that_raised_it() -> None:
    found = raised(TRACEBACK)
    assert found is not None and found.line == "RuntimeError: shapes differ: 3 vs 4"
    assert found.where == "/venv/lib/python3.12/site-packages/lib.py:7 in step (from train.py:30 in <module>)"


def test_a_tail_that_starts_mid_traceback_and_a_chain() -> None:
    assert raised(TRACEBACK[3:]).line == "RuntimeError: shapes differ: 3 vs 4"  # type: ignore[union-attr]
    chain = ['  File "a.py", line 1, in f', "KeyError: 'x'", "", "During handling of the above exception, another "
             "exception occurred:", "", "Traceback (most recent call last):", '  File "b.py", line 2, in g',
             "SystemExit"]
    found = raised(chain)
    assert found is not None and (found.line, found.where) == ("SystemExit", "b.py:2 in g")


def test_no_traceback_no_quote() -> None:
    assert raised(["error: train_batch_size 7 is not divisible", "hint: give 8"]) is None
    assert raised(['  File "a.py", line 1, in f', "  x = 1", "this is not an exception line"]) is None
    box = format_report([Failure("h", 0, 1, 0.0, rank=0, local_rank=0, stderr_tail=("error: bad", "hint: fix"))], 2)
    assert "raised at" not in box


def test_the_box_quotes_it_without_a_console_too() -> None:
    box = format_report([Failure("h", 0, 1, 0.0, rank=1, local_rank=1, stderr_tail=tuple(TRACEBACK))], 2)
    assert "  error     : RuntimeError: shapes differ: 3 vs 4\n  raised at : " in box
    assert "  last 7 lines of its stderr:" in box


def test_misplaced_options_move_only_the_refused_flags() -> None:
    ns = parse_args(["-q", "train.py", "--config", "c.json", "--num-gpus=2", "--log_dir", "logs", "--x"])
    hint = ns.misplaced
    assert hint is not None and [f for f, _, _ in hint.spans] == ["--config", "--num-gpus", "--log_dir"]
    said = hint(["train.py: error: unrecognized arguments: --num-gpus=2 --log_dir logs --x"])
    assert said is not None
    assert said.endswith("launcher options go before it: zerorun -q --num-gpus=2 --log_dir logs train.py "
                         "--config c.json --x")
    assert hint(["train.py: error: unrecognized arguments: --x"]) is None  # not the launcher's flag
    assert parse_args(["train.py", "--lr", "1"]).misplaced is None
