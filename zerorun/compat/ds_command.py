"""The ``deepspeed`` command: DeepSpeed 0.19.8's launcher grammar, run by zerorun's launcher.

``deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json`` parses exactly
as DeepSpeed's ``deepspeed.launcher.runner.parse_args`` does (options end at the script;
everything after it, quotes, spaces and ``$`` included, reaches the script untouched),
then becomes a ``zerorun --as_deepspeed ...`` launch: the same hostfile, filters, ports,
runner and flags, with ``import deepspeed`` in the ranks resolving to zerorun.

Where DeepSpeed raises ``ValueError`` on a flag combination, :func:`translate` does too;
flags whose feature zerorun does not have (``--no_ssh``, ``--autotuning``,
``--venv_script``, the MVAPICH/MPICH/Intel MPI launchers) are a :class:`LaunchError` with
the zerorun way to get the same result.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from launcher.errors import LaunchError
from launcher.plan.hostfile import find_hosts
from zerorun.compat.ds_resources import parse_range_list

DLTS_HOSTFILE = "/job/hostfile"
_RUNNERS = {"pdsh": "pdsh", "openmpi": "openmpi", "slurm": "slurm", "ssh": "ssh", "local": "local"}
_NO_RUNNER = {"mvapich": "MVAPICH", "mpich": "MPICH", "impi": "Intel MPI"}


def build_parser() -> argparse.ArgumentParser:
    """DeepSpeed 0.19.8's ``deepspeed`` options, names and defaults (``--launcher`` defaults to None here:
    DeepSpeed's ``pdsh`` default only matters for a multi-node launch, which zerorun's runner choice covers)."""
    p = argparse.ArgumentParser(prog="deepspeed", description="DeepSpeed's launcher command, run by zerorun "
                                "(the ranks' `import deepspeed` is zerorun).")
    p.add_argument("-H", "--hostfile", type=str, default=DLTS_HOSTFILE, help="hostfile (`worker-0 slots=4` lines)")
    p.add_argument("-i", "--include", type=str, default="", help="NODE_SPEC[@NODE_SPEC ...], NODE_SPEC=NAME[:SLOT[,SLOT ...]]")
    p.add_argument("-e", "--exclude", type=str, default="", help="resources NOT to use, same format as --include")
    p.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts of the hostfile")
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1, help="GPUs per node (ids 0..N-1)")
    p.add_argument("--master_port", default=29500, type=int, help="port of rank 0's store")
    p.add_argument("--master_addr", default="", type=str, help="address of node 0 (default: the first host)")
    p.add_argument("--node_rank", default=-1, type=int, help="with --no_ssh (not supported by zerorun)")
    p.add_argument("--launcher", default=None, type=str, help="pdsh, openmpi, slurm (also zerorun's ssh, local)")
    p.add_argument("--launcher_args", default="", type=str, help="launcher-specific arguments, one quoted string")
    p.add_argument("--module", action="store_true", help="run the script as `python -m`")
    p.add_argument("--no_python", action="store_true", help="run the script as an executable")
    p.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank to the script")
    p.add_argument("--no_ssh", action="store_true", help="one launcher per node (not supported by zerorun)")
    p.add_argument("--no_ssh_check", action="store_true", help="skip the ssh check of the hosts")
    p.add_argument("--force_multi", action="store_true", help="use the multi-node runner even for one node")
    p.add_argument("--save_pid", action="store_true", help="write this launcher's pid to /tmp/<pid>.ds")
    p.add_argument("--enable_each_rank_log", default="None", type=str, help="a folder for one log file per rank")
    p.add_argument("--autotuning", default="", choices=["tune", "run"], type=str, help="see `zerorun autotune`")
    p.add_argument("user_script", type=str, help="the training script, followed by its arguments")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    p.add_argument("--bind_cores_to_rank", action="store_true", help="bind each rank to its share of the cores")
    p.add_argument("--bind_core_list", type=str, default=None, help="cores to share out, e.g. 1,3-5,7")
    p.add_argument("--ssh_port", type=int, default=None, help="ssh port of every host")
    p.add_argument("--venv_script", type=str, default=None, help="a venv activation script (not supported by zerorun)")
    p.add_argument("--log_level", type=str, default="info", choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("-q", "--quiet", action="store_true", help="alias of --log_level error")
    return p


def parse_args(args: list[str] | None = None) -> argparse.Namespace:
    """``deepspeed.launcher.runner.parse_args``: the namespace DeepSpeed's launcher would see."""
    return build_parser().parse_args(args=args)


def _refuse_missing(ns: argparse.Namespace) -> None:
    if ns.no_ssh or ns.node_rank >= 0:
        raise LaunchError("--no_ssh/--node_rank (one launcher started by hand on each node) is not supported",
                          "give every node in a hostfile and let one zerorun start them (ssh, pdsh, slurm or mpirun)")
    if ns.autotuning:
        raise LaunchError(f"--autotuning {ns.autotuning} is DeepSpeed's autotuner",
                          f"run `zerorun autotune {ns.user_script} --config ds.json` instead")
    if ns.venv_script:
        raise LaunchError("--venv_script is not supported: every node runs the launcher's own Python",
                          "install the same virtual environment at the same path on every node")
    if ns.launcher and ns.launcher.lower() in _NO_RUNNER:
        raise LaunchError(f"--launcher {ns.launcher}: zerorun has no {_NO_RUNNER[ns.launcher.lower()]} runner",
                          "use --launcher openmpi, pdsh, slurm or ssh")
    if ns.launcher and ns.launcher.lower() not in _RUNNERS:
        raise LaunchError(f"--launcher {ns.launcher!r} is not a launcher", "use pdsh, openmpi, slurm or ssh")


def _where(ns: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if ns.hostfile != DLTS_HOSTFILE or Path(DLTS_HOSTFILE).is_file():
        out += ["--hostfile", ns.hostfile]
    for flag, value in (("--include", ns.include), ("--exclude", ns.exclude)):
        out += [flag, value] if value else []
    out += ["--num_nodes", str(ns.num_nodes)] if ns.num_nodes > 0 else []
    out += ["--num_gpus", str(ns.num_gpus)] if ns.num_gpus > 0 else []
    out += ["--master_port", str(ns.master_port)] if ns.master_port is not None else []
    out += ["--master_addr", ns.master_addr] if ns.master_addr else []
    hosts = find_hosts(ns.hostfile) if "--hostfile" in out else None  # a missing named file: zerorun's error
    multi = ns.force_multi or (hosts is not None and len(hosts) > 1)  # DeepSpeed runs one host locally
    if ns.launcher and multi:
        out += ["--launcher", _RUNNERS[ns.launcher.lower()]]
    elif ns.force_multi:
        out += ["--launcher", "pdsh"]  # DeepSpeed's default runner
    out += ["--launcher_args", ns.launcher_args] if ns.launcher_args else []
    out += ["--ssh_port", str(ns.ssh_port)] if ns.ssh_port is not None else []
    return out


def _how(ns: argparse.Namespace) -> list[str]:
    flags = [("-m", ns.module), ("--no_python", ns.no_python), ("--no_local_rank", ns.no_local_rank),
             ("--no_ssh_check", ns.no_ssh_check), ("--bind_cores_to_rank", ns.bind_cores_to_rank)]
    out = [flag for flag, on in flags if on]
    if ns.bind_core_list is not None:
        parse_range_list(ns.bind_core_list)  # DeepSpeed's ValueError for a bad or unordered list
        out += ["--bind_core_list", ns.bind_core_list]
    if ns.enable_each_rank_log != "None":
        out += ["--log_dir", ns.enable_each_rank_log]
    return out


def translate(args: list[str] | None = None) -> list[str]:
    """DeepSpeed launcher arguments -> the equivalent ``zerorun`` launcher arguments.

    Raises ``ValueError`` where DeepSpeed does: ``--num_nodes``/``--num_gpus`` with
    ``--include``/``--exclude``, and a bad ``--bind_core_list``.
    """
    parser = build_parser()
    parser.set_defaults(master_port=None)  # named only if the user named it: else zerorun's default and its free-port fallback
    ns = parser.parse_args(args=args)
    if (ns.num_nodes >= 0 or ns.num_gpus >= 0) and (ns.include or ns.exclude):
        raise ValueError("Cannot specify num_nodes/gpus with include/exclude")
    _refuse_missing(ns)
    return ["--as_deepspeed", *_where(ns), *_how(ns), ns.user_script, *ns.user_args]


@contextlib.contextmanager
def _pid_file(on: bool) -> Iterator[None]:
    path = Path(f"/tmp/{os.getpid()}.ds")
    if on:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
    try:
        yield
    finally:
        if on:
            path.unlink(missing_ok=True)


def run(args: list[str] | None = None) -> int:
    """``deepspeed.launcher.runner.main``: launch, return the exit status; DeepSpeed's ValueErrors propagate."""
    from launcher.main import main as launch_main

    argv = translate(args)
    with _pid_file(parse_args(args).save_pid):
        return launch_main(argv)


def main(argv: list[str] | None = None) -> int:
    """The ``deepspeed`` console command, behind zerorun's error boundary (``error:``/``hint:``, no traceback)."""
    from zerorun.cli import main as cli_main
    from zerorun.commands.boundary import print_error
    from zerorun.errors import UsageError

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        zerorun_args = translate(args)
    except ValueError as err:
        print_error(UsageError(str(err), hint="see `deepspeed --help`", usage="deepspeed [options] SCRIPT [args]"))
        return 2
    except LaunchError as err:
        print_error(err)
        return err.exit_code
    with _pid_file(parse_args(args).save_pid):
        return cli_main(["launch", *zerorun_args])
