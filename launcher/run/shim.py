"""Per-rank shim for ``srun`` and ``mpirun``: ``python -m launcher.run.shim [--pass_local_rank] -- CMD...``.

srun and mpirun start every rank themselves; the shim is the one rank's agent. It maps
their variables (SLURM_*, OMPI_COMM_WORLD_*) to the ones torch.distributed and zerorun
read (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, ...), starts the
user's command as its child (which dies with the shim, even by SIGKILL), prefixes its
output with ``[host:rank]``, forwards SIGTERM/SIGINT/SIGHUP to it (SIGKILL after
``ZERORUN_KILL_TIMEOUT`` seconds), and when the rank fails on its own reports it to
the launcher as an agent ``failed`` event - so the launcher names the rank, its exit
code and the time, whatever srun's or mpirun's own summary says.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO

from launcher.errors import LaunchError
from launcher.protocol import KEY_ENV, MAX_TEXT, drop_key, encode_event
from launcher.run.lifecycle import exit_status
from launcher.run.lifeline import die_with_parent
from launcher.run.output import OutputSink
from zerorun.compat.activate import rank_env as compat_env

NODES_ENV = "ZERORUN_NODES"
"""``host:ranks,host:ranks,...`` in plan order: the node of each global rank under mpirun."""
KILL_TIMEOUT_ENV = "ZERORUN_KILL_TIMEOUT"


def _slurm_local_size(env: Mapping[str, str]) -> str:
    if "SLURM_NTASKS_PER_NODE" in env:
        return env["SLURM_NTASKS_PER_NODE"]
    # SLURM_TASKS_PER_NODE looks like "2(x3),1": the first count is this layout's first node
    match = re.match(r"(\d+)", env.get("SLURM_TASKS_PER_NODE", "1"))
    return match.group(1) if match else "1"


def parse_nodes(text: str) -> list[tuple[str, int]]:
    """``"a:2,b:2"`` -> ``[("a", 2), ("b", 2)]`` (an IPv6 host keeps its colons)."""
    nodes = []
    for item in filter(None, text.split(",")):
        host, _, count = item.rpartition(":")
        nodes.append((host, int(count)))
    return nodes


def _ompi_node(env: Mapping[str, str]) -> str:
    """mpirun fills the nodes in ``--host`` order; OMPI_COMM_WORLD_NODE_RANK is a per-node rank, not this."""
    rank = int(env["OMPI_COMM_WORLD_RANK"])
    nodes = parse_nodes(env.get(NODES_ENV, ""))
    start = 0
    for index, (_, count) in enumerate(nodes):
        if rank < start + count:
            return str(index)
        start += count
    return str(rank // max(int(env["OMPI_COMM_WORLD_LOCAL_SIZE"]), 1))  # uniform nodes, no plan given


def rank_vars(env: Mapping[str, str]) -> dict[str, str]:
    """RANK and friends from srun's or mpirun's variables (pure)."""
    if "OMPI_COMM_WORLD_RANK" in env:
        out = {
            "RANK": env["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
            "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"], "LOCAL_WORLD_SIZE": env["OMPI_COMM_WORLD_LOCAL_SIZE"],
            "NODE_RANK": _ompi_node(env),
        }
    elif "SLURM_PROCID" in env:
        out = {
            "RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"], "LOCAL_RANK": env["SLURM_LOCALID"],
            "LOCAL_WORLD_SIZE": _slurm_local_size(env), "NODE_RANK": env.get("SLURM_NODEID", "0"),
        }
    else:
        raise LaunchError(
            "launcher.run.shim found neither SLURM_PROCID nor OMPI_COMM_WORLD_RANK",
            "the shim runs under srun or mpirun; use `zerorun --launcher local` to run here",
        )
    out["LOCAL_SIZE"] = out["LOCAL_WORLD_SIZE"]
    out["GROUP_RANK"] = out["CROSS_RANK"] = out["NODE_RANK"]
    return out


def host_name(env: Mapping[str, str]) -> str:
    """This rank's node as the plan names it (mpirun), as Slurm names it (srun), else the hostname."""
    nodes = parse_nodes(env.get(NODES_ENV, ""))
    node = int(env.get("NODE_RANK", "0"))
    if "OMPI_COMM_WORLD_RANK" in env and node < len(nodes):
        return nodes[node][0]
    return env.get("SLURMD_NODENAME") or socket.gethostname()


class RankShim:
    """Runs and watches one rank under srun or mpirun."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.key = env.get(KEY_ENV, "")
        env = drop_key(env)  # the rank never sees the channel key
        self.env = env
        self.rank, self.local_rank = int(env["RANK"]), int(env["LOCAL_RANK"])
        self.host = host_name(env)
        self.kill_timeout = float(env.get(KILL_TIMEOUT_ENV, "10"))
        self.sink = OutputSink(self.host, sys.stdout.buffer, sys.stderr.buffer)
        self.stop_signal: int | None = None
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        # mpirun's daemon may SIGKILL the shim alone: the rank must not outlive it
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=die_with_parent(signal.SIGKILL))
        self.readers = [threading.Thread(target=self._pump, args=(s, e), daemon=True)
                        for s, e in ((self.proc.stdout, False), (self.proc.stderr, True))]
        for t in self.readers:
            t.start()

    def _pump(self, stream: IO[bytes] | None, is_err: bool) -> None:
        assert stream is not None
        for data in iter(stream.readline, b""):
            self.sink.line(self.rank, data, is_err)

    def on_signal(self, signum: int, _frame: object) -> None:
        """srun/mpirun stop the step (or the launcher stops them): pass it on, it is not a failure.

        The handler only queues the signal; the wait loop forwards it (no lock taken in a handler)."""
        self.signals.put(signum)

    def wait(self) -> int:
        deadline: float | None = None
        while self.proc.poll() is None:
            while not self.signals.empty():
                self.stop_signal = self.signals.get()
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(self.stop_signal)
            if self.stop_signal is not None and deadline is None:
                deadline = time.monotonic() + self.kill_timeout
            if deadline is not None and time.monotonic() > deadline:
                self.proc.kill()
            time.sleep(0.05)
        if not self.signals.empty():  # a stop that arrived as the rank ended on its own
            self.stop_signal = self.signals.get()
        for t in self.readers:
            t.join(timeout=1.0)
        rc = self.proc.returncode
        if rc != 0 and self.stop_signal is None:
            self._report(rc)
        return exit_status(rc)

    def _report(self, rc: int) -> None:
        sig = signal.Signals(-rc).name if rc < 0 and -rc in signal.valid_signals() else None
        self.sink.raw(encode_event(
            self.key, "failed", node_rank=int(self.env.get("NODE_RANK", "0")), host=self.host, rank=self.rank,
            local_rank=self.local_rank, exit_code=exit_status(rc), signal=sig, pid=self.proc.pid, time=time.time(),
            stderr_tail=[t[:MAX_TEXT] for t in self.sink.tail(self.rank)], log_path=None,
        ))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pass_local_rank, at = False, None
    if args and args[0].split("=", 1)[0] == "--pass_local_rank":  # `=K`: insert at K (before the script's args)
        pass_local_rank, at, args = True, (int(args[0].split("=", 1)[1]) if "=" in args[0] else None), args[1:]
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m launcher.run.shim [--pass_local_rank[=K]] -- COMMAND [ARGS]", file=sys.stderr)
        return 2
    env = {**os.environ, **rank_vars(os.environ)}
    env.update(compat_env(env))  # ZERORUN_AS_DEEPSPEED: the `deepspeed` package on PYTHONPATH
    if pass_local_rank:
        args.insert(len(args) if at is None else at, f"--local_rank={env['LOCAL_RANK']}")
    try:
        shim = RankShim(args, env)
    except OSError as e:  # the rank's command itself cannot start: srun/mpirun report the 127
        print(f"[rank {env['RANK']}] zerorun: cannot start {args[0]!r}: {e.strerror or e}", file=sys.stderr)
        return 127
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, shim.on_signal)
    status = shim.wait()
    shim.sink.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
