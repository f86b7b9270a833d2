"""The autotune command line: launcher options forwarded token for token, the script's untouched."""

from __future__ import annotations

import pytest

from zerorun.autotune.args import AutotuneArgsError, durations, parse_autotune_args
from zerorun.errors import UsageError


def test_launcher_options_are_forwarded_and_autotune_options_kept() -> None:
    args = parse_autotune_args([
        "--num_gpus", "2", "--config", "ds.yaml", "--trial-steps", "3", "--dry-run", "--env", "A=1",
        "--knobs", "reduce_bucket_size", "--stage=3", "train.py", "--trial-steps", "9", "--config", "x",
    ])
    assert args.launcher_args == ("--num_gpus", "2", "--config", "ds.yaml", "--env", "A=1", "--master_port", "auto")
    assert args.script == "train.py"
    assert args.script_args == ("--trial-steps", "9", "--config", "x")  # the script's, untouched
    ns = args.ns
    assert (ns.trial_steps, ns.dry_run, ns.knobs, ns.stage, ns.warmup_steps) == (3, True, "reduce_bucket_size", 3, 3)


def test_a_given_master_port_is_kept() -> None:
    args = parse_autotune_args(["--master_port=29123", "--config", "c.yaml", "t.py"])
    assert args.launcher_args == ("--master_port=29123", "--config", "c.yaml")


def test_config_is_required_with_a_hint() -> None:
    with pytest.raises(AutotuneArgsError) as err:
        parse_autotune_args(["--num_gpus", "2", "train.py"])
    assert "--config" in err.value.message and "zerorun autotune" in (err.value.hint or "")


@pytest.mark.parametrize("bad", [["--trial-steps", "0"], ["--warmup-steps", "-1"], ["--repeats", "0"]])
def test_bad_values_are_refused(bad: list[str]) -> None:
    with pytest.raises(AutotuneArgsError):
        parse_autotune_args(["--config", "c.yaml", *bad, "t.py"])


def test_options_after_the_script_are_the_scripts() -> None:
    args = parse_autotune_args(["--config", "c.yaml", "--json", "t.py", "--json", "--lr", "1"])
    assert args.ns.json and args.script_args == ("--json", "--lr", "1")
    with pytest.raises(UsageError, match="--dry-run comes after SCRIPT"):  # a dry run must never start trials
        parse_autotune_args(["--config", "c.yaml", "t.py", "--dry-run"])
    explicit = parse_autotune_args(["--config", "c.yaml", "--", "t.py", "--dry-run"])
    assert not explicit.ns.dry_run and explicit.script_args == ("--dry-run",)
    assert parse_autotune_args(["--config", "c.yaml", "--trial_steps", "4", "t.py"]).ns.trial_steps == 4


def test_durations() -> None:
    args = parse_autotune_args(["--config", "c.yaml", "--time-budget", "10m", "--trial-timeout", "90s", "t.py"])
    assert durations(args.ns) == (600.0, 90.0)
    assert durations(parse_autotune_args(["--config", "c.yaml", "t.py"]).ns) == (None, None)
