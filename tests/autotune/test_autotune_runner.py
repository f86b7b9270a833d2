"""One trial through the real launcher: the argv, a crash, and a timeout that tears the ranks down.

The scripts here do not train (no engine, so no torch import): they stand for scripts
that crash or hang, which is all the runner has to tell apart; the end-to-end test runs
the real engine.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from zerorun.autotune.classify import Outcome
from zerorun.autotune.runner import TrialRunner


def _runner(script: Path, *args: str) -> TrialRunner:
    return TrialRunner(("--num_gpus", "2", "--master_port", "auto"), str(script), args, warmup=1, steps=2,
                       fixed={"stage": 2})


def test_the_trial_command_is_the_users_launch() -> None:
    runner = _runner(Path("train.py"), "--lr", "1")
    assert runner.command() == [sys.executable, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto",
                                "train.py", "--lr", "1"]
    spec = runner.spec({"reduce_bucket_size": 8}, Path("/t"))
    assert spec.overrides == {"stage": 2, "reduce_bucket_size": 8} and spec.result_path == Path("/t/result.json")
    assert (spec.warmup, spec.steps) == (1, 2)


@pytest.mark.timeout(120)
def test_a_crash_without_a_record_is_a_crash_with_the_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import os, sys\nprint(os.environ['ZERORUN_TRIAL_OVERRIDES'])\nsys.exit(3)\n")
    run = _runner(script).run({"reduce_bucket_size": 8}, tmp_path / "t1", timeout_s=90)
    assert run.outcome.status is Outcome.CRASH and "exit code 3" in run.outcome.reason
    assert '"reduce_bucket_size": 8' in run.log_path.read_text()  # the trial env reached the ranks


@pytest.mark.timeout(120)
def test_a_hanging_trial_times_out_and_leaves_no_rank_behind(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import os, time
        from pathlib import Path
        Path(os.environ["ZERORUN_TEST_PIDS"], os.environ["RANK"]).write_text(str(os.getpid()))
        time.sleep(300)
    """))
    pids = tmp_path / "pids"
    pids.mkdir()
    runner = TrialRunner(("--num_gpus", "2", "--master_port", "auto", "--kill_timeout", "2"), str(script), (),
                         warmup=0, steps=1, env={"ZERORUN_TEST_PIDS": str(pids)})
    began = time.monotonic()
    run = runner.run({}, tmp_path / "t2", timeout_s=8)
    assert run.outcome.status is Outcome.TIMEOUT
    assert time.monotonic() - began < 60
    ranks = sorted(pids.iterdir())
    assert [p.name for p in ranks] == ["0", "1"]
    for p in ranks:
        assert not Path(f"/proc/{p.read_text()}").exists(), f"rank {p.name} still running"
