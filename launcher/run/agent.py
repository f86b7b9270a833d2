"""The per-node agent: ``python -m launcher.run.agent --node_rank K [--payload FILE]``.

The only code that spawns ranks. It reads the plan (JSON, with the env values) from
the first line of stdin or from a 0600 file it deletes (refused unless this user owns
the file and its folder, neither open to others, and the file is no symlink), starts
the node's ranks (each in its own session, so a signal reaches the rank's whole
process group, and each with a lifeline: a SIGKILLed agent takes its ranks along),
prefixes their output, and watches them. On the first rank failure it stops every
rank on the node (SIGTERM, SIGKILL after ``kill_timeout``), reports the failure as
an event line and exits with that rank's status (128+N for a signal). It keeps
reading stdin for commands; EOF means the launcher is gone and the ranks go too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from launcher.plan.affinity import available_cores, core_share
from launcher.plan.devices import gpu_count
from launcher.plan.launch_plan import DeviceMode, LaunchPlan, rank_argv, rank_env
from launcher.plan.threads import VAR as THREADS_VAR
from launcher.plan.threads import node_cores, threads_for
from launcher.protocol import MAX_TEXT, Command, drop_key, encode_event
from launcher.run.lifecycle import RankState, exit_status, transition
from launcher.run.lifeline import die_with_parent
from launcher.run.output import OutputSink
from launcher.run.planfile import read_plan_file
from launcher.watch.heartbeat_relay import HeartbeatRelay
from zerorun.compat.activate import rank_env as compat_env

POLL_S = 0.05
GONE = "gone"


@dataclass
class RankProcess:
    """One rank on this node."""

    rank: int
    local_rank: int
    proc: subprocess.Popen[bytes]
    state: RankState = RankState.RUNNING
    readers: list[threading.Thread] = field(default_factory=list)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)


def read_payload(payload: str | None, stdin: IO[bytes]) -> LaunchPlan:
    """The plan from ``payload`` (checked, deleted once read) or from the first line of stdin."""
    text = read_plan_file(payload) if payload is not None else stdin.readline().decode()
    if not text.strip():
        raise SystemExit("zerorun agent: no plan received (empty stdin or payload file)")
    return LaunchPlan.from_dict(json.loads(text))


def _arm(lifeline: Callable[[], None], pin: Callable[[], None] | None) -> None:
    """In the rank's child process before exec: the lifeline (a rank gets SIGKILL when its
    agent dies, SIGKILLed or OOM-killed: no orphan trains on), then the core binding."""
    lifeline()
    if pin is not None:
        pin()


class Agent:
    """Runs and watches the ranks of one node."""

    def __init__(self, plan: LaunchPlan, node_rank: int, sink: OutputSink) -> None:
        self.plan = plan
        self.node = plan.node(node_rank)
        self.sink = sink
        self.ranks: list[RankProcess] = []
        self.commands: queue.SimpleQueue[str] = queue.SimpleQueue()  # signal handlers put here: no lock to deadlock on
        self.failure: tuple[RankProcess, int] | None = None
        self.stop_reason: str | None = None
        self.kill_deadline: float | None = None
        self.relay = HeartbeatRelay(self.node.node_rank, self._emit)

    def _emit(self, kind: str, **fields: object) -> None:
        self.sink.raw(encode_event(self.plan.channel_key, kind, **fields))

    def start(self) -> None:
        gpu = self.plan.options.devices is DeviceMode.GPU or (
            self.plan.options.devices is DeviceMode.AUTO and gpu_count() > 0
        )
        shares = self._core_shares()
        lifeline = die_with_parent(signal.SIGKILL)
        for local_rank, rank in enumerate(self.node.ranks):
            env = drop_key({**os.environ, **rank_env(self.plan, self.node.node_rank, local_rank, gpu)})
            env.update(compat_env(env))  # ZERORUN_AS_DEEPSPEED: the `deepspeed` package on PYTHONPATH
            pin = None
            share = None if shares is None else shares[local_rank]
            omp = threads_for(env, self.plan.options.threads_per_rank, len(self.node.ranks), node_cores(),
                              None if share is None else len(share))
            if omp is not None:  # unset: each rank's share of the cores, not all of them (torchrun's rule)
                env[THREADS_VAR] = omp
            if share is not None:
                pin = functools.partial(os.sched_setaffinity, 0, share)  # in the child, before exec
            beat_env, beat_fds = self.relay.prepare(rank)  # the heartbeat pipe and stack file (heartbeat_relay)
            env.update(beat_env)
            proc = subprocess.Popen(
                rank_argv(self.plan, local_rank), env=env, cwd=self.plan.cwd, preexec_fn=functools.partial(_arm, lifeline, pin),
                pass_fds=beat_fds,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
            self.relay.spawned(rank, proc.pid)
            rp = RankProcess(rank, local_rank, proc)
            for stream, is_err in ((proc.stdout, False), (proc.stderr, True)):
                t = threading.Thread(target=self._pump, args=(rp, stream, is_err), daemon=True)
                t.start()
                rp.readers.append(t)
            self.ranks.append(rp)
        pids = {str(rp.rank): rp.proc.pid for rp in self.ranks}
        self.sink.raw(encode_event(self.plan.channel_key, "started", node_rank=self.node.node_rank, host=self.node.host, pids=pids))

    def _core_shares(self) -> list[list[int]] | None:
        """Each local rank's cores under ``--bind_cores_to_rank`` (None without it)."""
        opts = self.plan.options
        if not opts.bind_cores:
            return None
        cores, n = available_cores(opts.bind_core_list), len(self.node.ranks)
        return [core_share(cores, i, n) for i in range(n)]

    def _pump(self, rp: RankProcess, stream: IO[bytes] | None, is_err: bool) -> None:
        assert stream is not None
        for data in iter(stream.readline, b""):
            self.sink.line(rp.rank, data, is_err)
        stream.close()

    def watch_stdin(self, stdin: IO[bytes]) -> None:
        """Feed launcher commands into the queue; EOF (launcher gone) becomes GONE."""
        for data in iter(stdin.readline, b""):
            self.commands.put(data.decode().strip())
        self.commands.put(GONE)

    def stop(self, reason: str, signum: int = signal.SIGTERM) -> None:
        """Ask every running rank to stop; SIGKILL follows after ``kill_timeout``."""
        if self.stop_reason is None:
            self.stop_reason = reason
        for rp in self.ranks:
            if rp.state is RankState.RUNNING:
                rp.state = transition(rp.state, RankState.STOPPING)
            if rp.state is RankState.STOPPING:
                rp.signal(signum)
        if signum == signal.SIGKILL:
            self.kill_deadline = time.monotonic()
        elif signum == signal.SIGTERM and self.kill_deadline is None:  # SIGINT: the ranks may wind down
            self.kill_deadline = time.monotonic() + self.plan.options.kill_timeout

    def _handle_command(self, cmd: str) -> None:
        if cmd == Command.STOP.value:
            self.stop("stopped by the launcher")
        elif cmd == Command.INT.value:
            self.stop("interrupted (SIGINT)", signal.SIGINT)
        elif cmd == Command.KILL.value:
            self.stop("killed by the launcher", signal.SIGKILL)
        elif cmd == Command.STACKS.value:
            self.relay.dump_all()
        elif cmd == GONE:
            self.stop("the launcher is gone (stdin closed)")

    def _reap(self) -> None:
        failed: list[tuple[RankProcess, int]] = []
        for rp in self.ranks:
            rc = rp.proc.poll()
            if rc is None or rp.state.done:
                continue
            self.relay.exited(rp.rank, exit_status(rc))
            if rp.state is RankState.STOPPING:
                rp.state = transition(rp.state, RankState.STOPPED)
            elif rc == 0:
                rp.state = transition(rp.state, RankState.SUCCEEDED)
            else:
                rp.state = transition(rp.state, RankState.FAILED)
                failed.append((rp, rc))
        # A rank killed by a signal takes its peers down with it: they fail in their next
        # collective milliseconds later, often within the same poll. The death by signal
        # is then the root cause, whatever the rank order.
        failed.sort(key=lambda item: item[1] >= 0)
        if failed and self.failure is None:
            self._report_failure(*failed[0])

    def _report_failure(self, rp: RankProcess, rc: int) -> None:
        status = exit_status(rc)
        self.failure = (rp, status)
        for t in rp.readers:
            t.join(timeout=1.0)  # the rank's last lines belong in the report
        sig = signal.Signals(-rc).name if rc < 0 and -rc in signal.valid_signals() else None
        self.sink.raw(encode_event(
            self.plan.channel_key, "failed", node_rank=self.node.node_rank, host=self.node.host, rank=rp.rank, local_rank=rp.local_rank,
            exit_code=status, signal=sig, pid=rp.proc.pid, time=time.time(),
            stderr_tail=[t[:MAX_TEXT] for t in self.sink.tail(rp.rank)], log_path=self.sink.log_path(rp.rank),
        ))
        self.stop(f"rank {rp.rank} failed")

    def loop(self) -> int:
        """Watch until every rank is done; return the node's exit status."""
        while not all(rp.state.done for rp in self.ranks):
            with contextlib.suppress(queue.Empty):
                self._handle_command(self.commands.get(timeout=POLL_S))
            if self.sink.broken.is_set():
                self._handle_command(GONE)
            self._reap()
            if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
                for rp in self.ranks:
                    if not rp.state.done:
                        rp.signal(signal.SIGKILL)
        for rp in self.ranks:
            rp.signal(signal.SIGKILL)  # stray children left in a rank's group
            for t in rp.readers:
                t.join(timeout=1.0)
        return self._status()

    def _status(self) -> int:
        if self.failure is not None:
            return self.failure[1]
        if self.stop_reason is not None:
            return 130 if "SIGINT" in self.stop_reason else 143
        return 0


def _install_signals(agent: Agent) -> None:
    signal.signal(signal.SIGINT, lambda *_: agent.commands.put(Command.INT.value))
    signal.signal(signal.SIGTERM, lambda *_: agent.commands.put(Command.STOP.value))
    signal.signal(signal.SIGHUP, lambda *_: agent.commands.put(GONE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.run.agent", description=__doc__)
    parser.add_argument("--node_rank", type=int, required=True)
    parser.add_argument("--payload", default=None, help="0600 plan file (deleted once read); default: stdin")
    args = parser.parse_args(argv)
    stdin = sys.stdin.buffer
    plan = read_payload(args.payload, stdin)
    node = plan.node(args.node_rank)
    opts = plan.options
    sink = OutputSink(
        node.address, sys.stdout.buffer, sys.stderr.buffer,
        color=opts.color, console_ranks=opts.console_ranks, log_dir=opts.log_dir,
    )
    agent = Agent(plan, args.node_rank, sink)
    _install_signals(agent)
    threading.Thread(target=agent.watch_stdin, args=(stdin,), daemon=True).start()
    agent.start()
    status = agent.loop()
    sink.raw(encode_event(plan.channel_key, "exited", node_rank=node.node_rank, host=node.host, exit_code=status, reason=agent.stop_reason))
    agent.relay.close()
    sink.close()
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a daemon thread may still block in stdin.readline(); do not wait for it
