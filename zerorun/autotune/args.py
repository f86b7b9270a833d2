"""``zerorun autotune [launcher options] --config FILE [autotune options] SCRIPT [args]``.

The launcher's parser with the autotune options added: as for the launcher, options
end at the script and everything after it is the script's. The launcher options are
handed, token for token, to every trial's launcher run (with ``--master_port auto``
unless a port is given, so a trial never waits on the last one's port).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from launcher.args import build_parser, split_argv
from zerorun.autotune.search import parse_duration
from zerorun.errors import UsageError

AUTOTUNE_EXAMPLES = """\
Examples:
  zerorun autotune --num_gpus 2 --config ds.yaml train.py --epochs 1
  zerorun autotune --num_gpus 8 --config ds.yaml --stage 3 --time-budget 30m train.py
  zerorun autotune --num_gpus 2 --config ds.yaml --dry-run --params 1.3B --gpu-memory 24GiB train.py
  zerorun autotune --num_gpus 2 --config ds.yaml --knobs reduce_bucket_size,overlap_comm train.py
  zerorun autotune --num_gpus 2 --config ds.yaml --repeats 3 --json train.py > tuning.json
"""
_OWN_DESTS = frozenset({
    "stage", "trial_steps", "warmup_steps", "time_budget", "trial_timeout", "out", "metric", "hidden_size",
    "params", "gpu_memory", "tune_micro_batch", "knobs", "grid_points", "rounds", "dry_run", "json", "repeats",
})
_DRY_RUN = frozenset({"--dry-run", "--dry_run"})


USAGE = "zerorun autotune [launcher options] --config FILE [autotune options] SCRIPT [script args]"


class AutotuneArgsError(UsageError):
    """The autotune command line cannot be used (a usage error: exit 2)."""

    def __init__(self, message: str, hint: str | None = None, usage: str | None = USAGE) -> None:
        super().__init__(message, hint, usage)


@dataclass(frozen=True)
class AutotuneArgs:
    """The parsed command line: autotune's options, the launcher's tokens, the script."""

    ns: argparse.Namespace
    launcher_args: tuple[str, ...]
    script: str
    script_args: tuple[str, ...]


def build_autotune_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "zerorun autotune"
    p.usage = USAGE
    p.description = ("Tune the ZeRO bucket and prefetch sizes of SCRIPT by short real trials, each one a launcher "
                     "run of the unchanged script; write the ranked trials and the best config. Every flag takes - or _ "
                     "alike; options end at SCRIPT, the rest is the script's.")
    p.epilog = AUTOTUNE_EXAMPLES
    a = p.add_argument_group("autotune")
    a.add_argument("--stage", type=int, choices=[1, 2, 3], help="tune this ZeRO stage (default: the config's)")
    a.add_argument("--trial-steps", type=int, default=10, help="timed optimizer steps per trial (default 10)")
    a.add_argument("--warmup-steps", type=int, default=3, help="untimed optimizer steps first (default 3)")
    a.add_argument("--time-budget", help="stop starting trials after this long, e.g. 10m, 1.5h (default: none)")
    a.add_argument("--trial-timeout", help="stop a trial after this long (default: 4x the baseline trial, >= 60s)")
    a.add_argument("--out", default="autotune", help="ledger.jsonl, best.yaml and trial logs go here (default autotune/)")
    a.add_argument("--metric", choices=["throughput", "memory"], default="throughput",
                   help="maximise samples/s, or minimise peak memory (default throughput)")
    a.add_argument("--hidden-size", type=int, help="the model's hidden size (default: learned from the baseline trial)")
    a.add_argument("--params", help="parameter count for the memory pruning, e.g. 1.3B (default: from the baseline)")
    a.add_argument("--gpu-memory", help="memory per GPU for the pruning: a card (h100, a100-80, 4090, ...) or its label's size, "
                                         "80GB = 80 GiB (default: the local GPUs')")
    a.add_argument("--tune-micro-batch", action="store_true", help="also tune the micro batch (global batch kept)")
    a.add_argument("--knobs", help="comma-separated knobs to tune (default: every knob of the stage)")
    a.add_argument("--grid-points", type=int, default=2, help="coarse values each side of the centre (default 2)")
    a.add_argument("--rounds", type=int, default=6, help="at most this many search rounds (default 6)")
    a.add_argument("--repeats", type=int, default=2,
                   help="runs of each candidate, interleaved with the others; the best counts (default 2)")
    _own_help(p, a)
    return p


_OWN_HELP = {
    "dry_run": "print the search space and round 1's candidates, each pruned by the memory estimate or not; "
               "run no trial",
    "json": "print the ranked trials (with --dry-run: the plan) as JSON",
}
"""The launcher's flags whose meaning autotune changes: their help is autotune's, under its heading."""


def _own_help(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> None:
    for action in parser._actions:
        if action.dest in _OWN_HELP:
            action.help = _OWN_HELP[action.dest]
            for other in parser._action_groups:
                if action in other._group_actions:
                    other._group_actions.remove(action)
            group._group_actions.append(action)


def _forwarded(parser: argparse.ArgumentParser, head: list[str]) -> list[str]:
    """The launcher's own tokens of ``head`` (SCRIPT and autotune's options removed)."""
    actions = parser._option_string_actions
    out: list[str] = []
    i = 0
    while i < len(head):
        token = head[i]
        if token == "--" or not token.startswith("-"):
            break  # SCRIPT (or `--` before it)
        action = actions.get(token.split("=", 1)[0])
        width = 2 if action is not None and action.nargs != 0 and "=" not in token else 1
        if action is None or action.dest not in _OWN_DESTS:
            out.extend(head[i : i + width])
        i += width
    return out


def parse_autotune_args(argv: list[str]) -> AutotuneArgs:
    parser = build_autotune_parser()
    head, tail = split_argv(parser, argv)
    ns = parser.parse_args(head)
    if ns.config is None:
        raise AutotuneArgsError("zerorun autotune needs --config FILE (the starting config)",
                                hint="e.g. zerorun autotune --num_gpus 2 --config ds.yaml train.py")
    explicit = "--" in head  # `zerorun autotune [opts] -- SCRIPT --dry-run`: the script's own flag
    if not explicit and _DRY_RUN & {t.split("=", 1)[0] for t in tail}:
        raise UsageError(f"--dry-run comes after SCRIPT {ns.script!r}, so it is one of the script's arguments "
                         "and every trial would really run",
                         hint=f"put it before the script: zerorun autotune ... --dry-run {ns.script} ...; to pass it to "
                              "the script, write `--` before SCRIPT",
                         usage=parser.usage)
    for name in ("trial_steps", "grid_points", "rounds", "repeats"):
        if getattr(ns, name) < 1:
            raise AutotuneArgsError(f"--{name.replace('_', '-')} must be at least 1", hint="give a positive integer")
    if ns.warmup_steps < 0:
        raise AutotuneArgsError("--warmup-steps must be 0 or more", hint="e.g. --warmup-steps 3")
    forwarded = _forwarded(parser, head)
    if not any(t.split("=", 1)[0] == "--master_port" for t in forwarded):
        forwarded += ["--master_port", "auto"]
    return AutotuneArgs(ns, tuple(forwarded), ns.script, tuple(tail))


def durations(ns: argparse.Namespace) -> tuple[float | None, float | None]:
    """(time budget, trial timeout) in seconds."""
    budget = parse_duration(ns.time_budget) if ns.time_budget else None
    timeout = parse_duration(ns.trial_timeout) if ns.trial_timeout else None
    return budget, timeout
