"""The launcher's options (DeepSpeed's flag names, with underscores).

Options end at the first positional argument, the script; everything after it goes
to the script untouched, even if it looks like a launcher option.
"""

from __future__ import annotations

import argparse

from launcher.elastic.supervisor import add_elastic_options
from launcher.errors import LaunchError
from launcher.parser import HelpFormatter, LauncherParser
from launcher.plan.hostnames import MAX_RANKS, bounded_range
from launcher.plan.runners import RunnerKind
from launcher.plan.threads import threads_per_rank_arg
from launcher.watch.hints import MisplacedOptions
from launcher.watch.watch_args import add_watch_options

EXAMPLES = """\
Examples:
  zerorun --num_gpus 2 train.py --lr 1e-3          2 ranks here (CPU ranks on gloo without GPUs)
  zerorun --hostfile hostfiles/two-nodes train.py   every slot of every host (pdsh, else ssh)
  zerorun -H hosts --include 'w1:0-3@w2' train.py   4 slots of w1 and all of w2
  zerorun -H hosts --exclude 'w2:0' train.py        everything but slot 0 of w2
  zerorun -H hosts --launcher ssh --ssh_args '-F ./ssh_config -i key' train.py
  zerorun -H hosts --dry-run --json train.py        the plan and the per-node commands, nothing runs
  zerorun --config ds.yaml --log_dir logs train.py  validate the config first; per-rank log files
"""


def build_parser() -> argparse.ArgumentParser:
    p = LauncherParser(
        prog="zerorun", usage="zerorun [launcher options] SCRIPT [script args]",
        description="Launch SCRIPT on this machine or on the hosts of a hostfile. Every flag takes - or _ "
                    "alike (--num_gpus = --num-gpus); options end at SCRIPT, the rest is the script's.",
        epilog=EXAMPLES, formatter_class=HelpFormatter, allow_abbrev=False,
    )
    w = p.add_argument_group("where to run")
    w.add_argument("-H", "--hostfile", help="hostfile (`host slots=N` lines); default /job/hostfile if present, else this machine")
    w.add_argument("-i", "--include", help="keep only these hosts/slots, e.g. 'w1:0,1@w2' or 'w1:0-3'")
    w.add_argument("-e", "--exclude", help="drop these hosts/slots, e.g. 'w2' or 'w1:0'")
    w.add_argument("--num_nodes", type=int, help="use the first N hosts")
    w.add_argument("--num_gpus", "--gpus", "--nproc_per_node", "--num_accelerators", dest="num_gpus", type=int,
                   help="ranks per node (the first G slots); on a machine without GPUs, G CPU ranks")
    w.add_argument("--master_addr", help="address of rank 0's store (default: the first node; 127.0.0.1 locally)")
    w.add_argument("--master_port", help="port of rank 0's store, or `auto` for a free local port (default 29500; "
                                          "a job on this machine alone takes a free port when 29500 is taken, and says so)")
    w.add_argument("--devices", choices=["auto", "gpu", "cpu"], default="auto",
                   help="set CUDA_VISIBLE_DEVICES on nodes with GPUs (auto), always (gpu) or never (cpu)")
    r = p.add_argument_group("how to reach the nodes")
    r.add_argument("--launcher", type=str.lower, choices=[k.value for k in RunnerKind],
                   help="default: local for this machine alone; pdsh (if installed) or ssh for a hostfile")
    r.add_argument("--launcher_args", default="", help="extra arguments for pdsh/srun/mpirun, one quoted string")
    r.add_argument("--ssh_port", type=int, help="ssh port on every host")
    r.add_argument("--ssh_args", help="extra ssh arguments for every ssh (also pdsh's), e.g. '-F conf -i key'; env ZERORUN_SSH_ARGS")
    r.add_argument("--no_ssh_check", "--no_preflight", dest="no_ssh_check", action="store_true",
                   help="skip the preflight checks of the remote hosts (ssh, versions, master address and port)")
    e = p.add_argument_group("what the ranks get")
    e.add_argument("--env", action="append", default=[], metavar="K=V", help="export K=V to every rank (repeatable)")
    e.add_argument("--env_file", help="dotenv file to export (after ~/.zerorun_env, ./.zerorun_env, .deepspeed_env)")
    e.add_argument("--config", help="zerorun/DeepSpeed config: validated before launch, then passed as ZERORUN_CONFIG")
    e.add_argument("--pass_local_rank", action="store_true", default=True,
                   help="pass --local_rank=N before the script's arguments, as DeepSpeed's launcher does (the default)")
    e.add_argument("--no_local_rank", dest="pass_local_rank", action="store_false",
                   help="do not pass --local_rank=N to the script (it reads LOCAL_RANK instead)")
    e.add_argument("--bind_cores_to_rank", action="store_true",
                   help="pin each rank to its own share of the node's cores (and set OMP_NUM_THREADS to it)")
    e.add_argument("--bind_core_list", help="with --bind_cores_to_rank: the cores to share out, e.g. '0,2-5'")
    e.add_argument("--threads_per_rank", type=threads_per_rank_arg, metavar="N",
                   help="OMP_NUM_THREADS of every rank (default: OMP_NUM_THREADS if set, else each rank's "
                        "share of its node's cores, at least 1, as torchrun does)")
    e.add_argument("--as_deepspeed", action="store_true",
                   help="`import deepspeed` in the ranks resolves to zerorun's compatibility package (no script edit); "
                        "sets ZERORUN_AS_DEEPSPEED=1")
    e.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module: python -m SCRIPT")
    e.add_argument("--no_python", action="store_true", help="SCRIPT is an executable: run it without python")
    o = p.add_argument_group("watching the run")
    o.add_argument("--log_dir", help="also write each rank's output to DIR/rank<R>.log")
    o.add_argument("--ranks", help="show only these ranks on the console, e.g. '0' or '0,2-3' (logs keep all)")
    o.add_argument("--max_restarts", type=int, default=0,
                   help="after a failure, restart every rank up to N times (default 0); see --restart_backoff")
    o.add_argument("--restart_backoff", type=float, default=1.0,
                   help="seconds before the first restart, doubling for each next one (default 1)")
    o.add_argument("--kill_timeout", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL at teardown (default 10)")
    o.add_argument("--color", choices=["auto", "always", "never"], default="auto", help="colour the [host:rank] prefixes")
    o.add_argument("--debug", action="store_true",
                   help="full tracebacks for zerorun's own errors in the ranks too (sets ZERORUN_DEBUG=1)")
    o.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print the rank table and the per-node commands, run nothing")
    o.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    add_elastic_options(p.add_argument_group("elastic runs"))  # --nnodes MIN:MAX, --rejoin (launcher.elastic.supervisor)
    add_watch_options(o)  # live view, stall diagnosis, stragglers (launcher.watch.watch_args)
    p.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m, or program with --no_python)")
    p.add_argument("script_args", nargs="*", metavar="ARGS", help="the script's own arguments, passed untouched")
    return p


def split_argv(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """``(launcher options + SCRIPT, script args)``: the first non-option token is SCRIPT."""
    if isinstance(parser, LauncherParser):
        parser.both_spellings()
    actions = parser._option_string_actions
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[: i + 2], argv[i + 2 :]  # argparse itself honours `--`
        if not token.startswith("-") or token == "-":
            return argv[: i + 1], argv[i + 1 :]
        action = actions.get(token.split("=", 1)[0])
        takes_value = action is not None and action.nargs != 0
        i += 2 if takes_value and "=" not in token else 1
    return argv, []


def misplaced_options(parser: argparse.ArgumentParser, head: list[str], tail: list[str]) -> MisplacedOptions | None:
    """The launcher's own flags written after SCRIPT (they stay the script's; a hint names them if it fails)."""
    actions, spans, i = parser._option_string_actions, [], 0
    while i < len(tail):
        flag = tail[i].split("=", 1)[0]
        action = actions.get(flag)
        if action is None or flag in ("-h", "--help"):
            i += 1
            continue
        stop = i + (2 if action.nargs != 0 and "=" not in tail[i] and i + 1 < len(tail) else 1)
        spans.append((flag, i, stop))
        i = stop
    return MisplacedOptions(tuple(head), tuple(tail), tuple(spans)) if spans and head and "--" not in head else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the launcher's options; ``script_args`` are exactly the tokens after SCRIPT."""
    parser = build_parser()
    head, tail = split_argv(parser, argv)
    ns = parser.parse_args(head)
    ns.script_args = list(tail)
    ns.misplaced = misplaced_options(parser, head, tail)
    if ns.module and ns.no_python:
        raise LaunchError("--module and --no_python cannot be combined", "pick one way to run SCRIPT")
    return ns


def parse_rank_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)`` for ``--ranks``."""
    ranks: set[int] = set()
    for item in text.split(","):
        span = bounded_range(item, MAX_RANKS)
        if span is None:
            raise LaunchError(f"--ranks {text[:80]!r}: bad item {item[:40]!r}",
                              f"give ranks like 0,2-3 (ranges run upwards, ids below {MAX_RANKS})")
        ranks.update(span)
    return tuple(sorted(ranks))
