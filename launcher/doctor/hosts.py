"""Host checks through the launcher's own runner: ``zerorun doctor``, the launcher's
network preflight, and whoever must re-check hosts (elastic restarts) call ``check_hosts``.

One round trip, bounded by timeouts: a listener (launcher/doctor/probe_listen.py) binds the
master port on node 0, which tells whether the port is free there; at the same time every host
runs the probe (launcher/doctor/probe_script.py) in parallel, which reports versions, limits,
its clock, its route to the master and a TCP connect to that listener. The answers are
judged by launcher/doctor/verdicts.py. The local runner runs both on this machine; ssh
and pdsh run them over ssh with the launch's ssh options (pdsh's commands are ssh
under it, and cannot carry the listener's stdin); slurm runs each as a one-task step of
the allocation on its node, openmpi as a one-process mpirun on its node.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.doctor.collective import CollectiveReport
from launcher.doctor.verdicts import (
    Finding,
    Problem,
    clock_finding,
    disk_findings,
    limit_findings,
    network_findings,
    ssh_failure,
    suggest_ifname,
    version_findings,
)
from launcher.errors import LaunchError
from launcher.plan.ifname import IFNAME_VARS, node_ifnames, unset_vars
from launcher.plan.launch_plan import LaunchPlan, NodePlan
from launcher.plan.master import is_here
from launcher.plan.runners import RunnerKind, SshOptions, check_mpirun_as_root, ssh_target

PROBE_SOURCE = (Path(__file__).parent / "probe_script.py").read_text()
LISTEN_SOURCE = (Path(__file__).parent / "probe_listen.py").read_text()
PROBE_TAG = "zerorun-doctor"
LISTEN_TAG = "zerorun-doctor-listen"
FIRST_RETRY = 1.5
"""Seconds a probe retries a refused connect while the listener, started alongside, may not be up
yet; a host still refused is probed once more after the listener has said it is up."""


@dataclass(frozen=True)
class HostReport:
    """One host: its probe's answer (None when it did not answer) and what was found there."""

    host: str
    node_rank: int
    slots: int
    facts: dict[str, Any] | None
    findings: tuple[Finding, ...]
    seconds: float
    clock_offset: float | None = None

    @property
    def ok(self) -> bool:
        return not any(f.error for f in self.findings)


@dataclass(frozen=True)
class DoctorReport:
    """Every host's report, the master-side findings, and the verdict."""

    master_addr: str
    master_port: int
    runner: str
    hosts: tuple[HostReport, ...]
    master_findings: tuple[Finding, ...]
    ifname: str | None
    """The ``NCCL_SOCKET_IFNAME`` list that matches every host's route to the master (None: no advice)."""
    seconds: float
    interfaces: tuple[tuple[str, str], ...] = ()
    """``(host, interface)`` of each host's route to the master: what a launch exports per node."""
    exported: tuple[str, ...] = ()
    """The interface variables a launch would export (those neither the user nor a host sets)."""
    collective: CollectiveReport | None = None
    """The real collective over every rank (launcher/doctor/collective.py); None: not asked for."""

    @property
    def findings(self) -> tuple[Finding, ...]:
        late = self.collective.findings if self.collective else ()
        return self.master_findings + tuple(f for h in self.hosts for f in h.findings) + late

    @property
    def ok(self) -> bool:
        """Whether a launch would work: no error anywhere (warnings allowed)."""
        return not any(f.error for f in self.findings)

    def verdict(self) -> str:
        errors = [f for f in self.findings if f.error]
        warnings = len(self.findings) - len(errors)
        n = len(self.hosts)
        if not errors:
            c = self.collective
            ran = (f"; all-reduce over {c.result['world']} ranks ok" if c and c.result else "") + (
                f", slowest link {c.slowest['a']} - {c.slowest['b']}" if c and c.slowest else "")
            return f"ok: {n} host(s) ready for a launch ({warnings} warning(s)), checked in {self.seconds:.1f} s{ran}"
        bad = sorted({f.host for f in errors})
        return f"not ready: {len(errors)} error(s) on {', '.join(bad)} ({warnings} warning(s))"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verdict": self.verdict(), "master": f"{self.master_addr}:{self.master_port}",
                "runner": self.runner, "seconds": round(self.seconds, 3), "ifname_suggestion": self.ifname,
                "interfaces": dict(self.interfaces), "exported_by_launch": list(self.exported),
                "findings": [f.to_dict() for f in self.findings],
                "hosts": [{"host": h.host, "node_rank": h.node_rank, "slots": h.slots, "ok": h.ok, "facts": h.facts,
                           "clock_offset": h.clock_offset, "seconds": round(h.seconds, 3)} for h in self.hosts],
                "collective": self.collective.to_dict() if self.collective else None}


def remote_argv(plan: LaunchPlan, node: NodePlan, runner: RunnerKind, ssh: SshOptions, source: str, arg: str) -> list[str]:
    """``python -c SOURCE ARG`` on ``node``: directly for the local runner, as a one-task step of the
    allocation under Slurm (``--overlap``: beside any running step), one-process ``mpirun`` for Open MPI
    (its daemons over the launch's ssh options), else over ssh (quoted once, here)."""
    argv = [plan.python, "-c", source, arg]
    if runner is RunnerKind.LOCAL:
        return argv
    if runner is RunnerKind.OPENMPI:
        return ["mpirun", "-np", "1", "--host", f"{node.address}:1", "--mca", "plm_rsh_args", " ".join(ssh.options()),
                *argv]
    if runner is RunnerKind.SLURM:
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node.address}", "--overlap", "--unbuffered",
                "--quiet", "--export=ALL", *argv]
    return ["ssh", "-T", *ssh.options(), "--", ssh_target(node.host), shlex.join(argv)]


def _answer(stdout: str, tag: str) -> str | None:
    for line in stdout.splitlines():
        if line.startswith(tag + " "):
            return line[len(tag) + 1:]
    return None


class Listener:
    """The master-side listener: started first, closed when every probe has answered."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def status(self, timeout: float) -> str:
        """``ok``, ``busy ERRNO TEXT`` (the port is taken), or ``failed`` (no answer within ``timeout``)."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode(errors="replace") if ready else ""
        return _answer(line, LISTEN_TAG) or "failed"

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _probe(argv: list[str], timeout: float) -> tuple[int, str, str, float, float]:
    start = time.time()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr, start, time.time()
    except subprocess.TimeoutExpired:
        return 255, "", f"no answer within {timeout:.0f} s", start, time.time()


def _probe_all(plan: LaunchPlan, nodes: list[NodePlan] | tuple[NodePlan, ...], runner: RunnerKind, ssh: SshOptions,
               arg: str, timeout: float) -> list[tuple[int, str, str, float, float]]:
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as pool:
        return list(pool.map(lambda n: _probe(remote_argv(plan, n, runner, ssh, PROBE_SOURCE, arg), timeout), nodes))


def _refused(result: tuple[int, str, str, float, float]) -> bool:
    answer = _answer(result[1], PROBE_TAG)
    if result[0] != 0 or answer is None:
        return False
    return json.loads(answer)["network"].get("connect", {}).get("result") == "refused"


def _host_report(node: NodePlan, result: tuple[int, str, str, float, float]) -> HostReport:
    code, out, err, start, end = result
    answer = _answer(out, PROBE_TAG)
    if code != 0 or answer is None:
        return HostReport(node.host, node.node_rank, len(node.slots), None, (ssh_failure(node.host, code, err or out),),
                          end - start)
    facts = json.loads(answer)
    return HostReport(node.host, node.node_rank, len(node.slots), facts, (), end - start,
                      clock_offset=float(facts["time"]) - (start + end) / 2)


def _judge(plan: LaunchPlan, report: HostReport, ref: HostReport | None, port_free: bool) -> HostReport:
    facts = report.facts
    if facts is None:
        return report
    host, found = report.host, []
    if not facts["cwd_ok"]:
        found.append(Finding(host, Problem.NO_WORKDIR, f"{host} has no directory {plan.cwd}",
                             "launch from a directory that exists on every host (a shared file system)"))
    if ref is not None and ref.facts is not None and ref.host != host:
        found += version_findings(host, facts, ref.host, ref.facts)
    found += limit_findings(host, facts, report.slots)
    found += disk_findings(host, facts)
    if report.clock_offset is not None:
        skew = clock_finding(host, report.clock_offset, report.seconds / 2)
        found += [skew] if skew else []
    ifname_env = {k: v for k, v in plan.env if k in IFNAME_VARS}
    master_node = plan.nodes[0].address
    with_master = report.node_rank == 0 or (is_here(master_node) and is_here(plan.nodes[report.node_rank].address))
    net = network_findings(host, facts, plan.master_addr, plan.master_port, with_master, ifname_env)
    found += [f for f in net if port_free or f.problem not in (Problem.PORT_REFUSED, Problem.PORT_TIMEOUT)]
    return HostReport(report.host, report.node_rank, report.slots, facts, tuple(found), report.seconds,
                      report.clock_offset)


def _listener_findings(plan: LaunchPlan, status: str) -> tuple[Finding, ...]:
    host = plan.nodes[0].host
    if status == "ok" or status == "failed":  # a failed start shows as node 0's own probe failure
        return ()
    return (Finding(host, Problem.PORT_IN_USE, f"port {plan.master_port} is in use on the master {host} ({status[5:]})",
                    f"stop what holds it (`ss -ltnp 'sport = :{plan.master_port}'` there), "
                    "or pass another --master_port (`auto` picks a free one)"),)


def check_hosts(plan: LaunchPlan, runner: RunnerKind, ssh: SshOptions = SshOptions(), *,
                connect_timeout: float = 3.0, paths: dict[str, str] | None = None) -> DoctorReport:
    """Check every node of ``plan`` in parallel through ``runner``; never raises for a host's failure.

    Args:
        plan: the launch plan (its nodes, ``master_addr``/``master_port``, ``python``, ``cwd``
            and exported ``env`` are what is checked).
        runner: LOCAL (one node, this machine), SSH or PDSH (both probe over ssh), SLURM
            (inside an allocation: one ``srun --overlap`` step per node), OPENMPI (one
            one-process ``mpirun`` per node).
        ssh: the launch's ssh options (port, extra args, ConnectTimeout).
        connect_timeout: seconds each host's TCP connect to the master may take before the
            port counts as blocked (timed out).
        paths: ``{label: path}`` the job writes on every host (the save dir, NVMe swap
            folders): checked for write access and free space.

    Returns:
        A DoctorReport: ``ok`` (a launch would work), ``verdict()``, ``findings`` (each a
        Finding with its Problem class and fix), per-host ``hosts`` (facts, findings,
        clock offset) and ``to_dict()`` for JSON. Takes about one ssh round trip plus
        the listener's start; bounded by ``ssh.connect_timeout``.

    Raises:
        LaunchError: slurm outside an allocation; openmpi as root without Open MPI's consent.
    """
    if runner is RunnerKind.OPENMPI:
        check_mpirun_as_root((), os.environ, os.geteuid())  # as the launch would refuse it
    if runner is RunnerKind.SLURM and "SLURM_JOB_ID" not in os.environ:
        raise LaunchError("the host checks through slurm run inside an allocation (each probe is a step of it)",
                          "run it under salloc or sbatch, or pass --launcher ssh with the hostfile")
    start = time.time()
    timeout = ssh.connect_timeout + connect_timeout + 10.0
    # the listener and the probes start together (one round trip, not two): a probe retries a refused
    # connect briefly while the listener may still be starting; its verdict counts only if the listener bound
    # the port, and a refusal costs a second round trip for that host alone (not a long retry for everyone)
    listener = Listener(remote_argv(plan, plan.nodes[0], runner, ssh, LISTEN_SOURCE, str(plan.master_port)))
    try:
        opts = {"master": plan.master_addr, "port": plan.master_port, "cwd": plan.cwd, "connect": True,
                "timeout": connect_timeout, "retry": FIRST_RETRY, "paths": paths or {}}
        results = _probe_all(plan, plan.nodes, runner, ssh, json.dumps(opts), timeout)
        status = listener.status(ssh.connect_timeout + 5.0)
        refused = [i for i, r in enumerate(results) if status == "ok" and _refused(r)]
        if refused:  # the listener is up now: a refusal seen again is the network's, not the listener's start
            again = _probe_all(plan, [plan.nodes[i] for i in refused], runner, ssh,
                               json.dumps({**opts, "retry": 0.0}), timeout)
            for i, r in zip(refused, again, strict=True):
                results[i] = r
    finally:
        listener.close()
    raw = [_host_report(n, r) for n, r in zip(plan.nodes, results, strict=True)]
    ref = next((h for h in raw if h.facts is not None), None)
    hosts = tuple(_judge(plan, h, ref, status == "ok") for h in raw)
    routes = [h.facts["network"].get("route", {}).get("interface") if h.facts else None for h in hosts]
    ifname = suggest_ifname(routes) if len(plan.nodes) > 1 else None
    facts = [h.facts for h in hosts]
    per_node = node_ifnames(plan, facts) if len(plan.nodes) > 1 else {}
    interfaces = tuple((plan.nodes[r].host, name) for r, name in sorted(per_node.items()))
    return DoctorReport(plan.master_addr, plan.master_port, runner.value, hosts, _listener_findings(plan, status),
                        ifname, time.time() - start, interfaces, unset_vars(plan, facts) if per_node else ())
