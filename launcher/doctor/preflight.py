"""Preflight: every remote host checked in parallel over ssh before any rank starts.

Each host must be reachable (BatchMode, ConnectTimeout), have the working
directory, and run the same Python and zerorun versions as this machine. ssh's own
error text is shown for a host that fails. A multi-node launch then runs the cheap
part of the doctor (launcher/doctor/hosts.py: versions across hosts, the master as each
host resolves it, its route and the master port, free and reachable), so a job that
cannot rendezvous fails here, not after the backend's timeout, and the interface of each
node's route to the master is exported to its ranks when the user set none
(launcher/plan/ifname.py). ``--no_ssh_check``
(also spelt ``--no_preflight``) skips both.
"""

from __future__ import annotations

import platform
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata

from launcher.doctor.hosts import DoctorReport, check_hosts
from launcher.errors import PreflightError
from launcher.plan.ifname import export_ifnames
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.runners import RunnerKind, SshOptions, ssh_target

TAG = "zerorun-preflight"
_PROBE = (
    "import sys, importlib.metadata as m; "
    f"print('{TAG}', sys.version.split()[0], m.version('zerorun'))"
)


@dataclass(frozen=True)
class HostCheck:
    """What one host answered."""

    host: str
    returncode: int
    stdout: str
    stderr: str


def local_versions() -> tuple[str, str]:
    return platform.python_version(), metadata.version("zerorun")


def check_argv(plan: LaunchPlan, host: str, ssh: SshOptions) -> list[str]:
    cwd = shlex.quote(plan.cwd)  # every string the remote shell reads is quoted, the message's too
    missing = shlex.quote(f"{TAG}: working directory {plan.cwd} does not exist")
    remote = (
        f"test -d {cwd} || {{ printf '%s\\n' {missing} >&2; exit 3; }}; "
        f"{shlex.quote(plan.python)} -c {shlex.quote(_PROBE)}"
    )
    return ["ssh", "-T", *ssh.options(), "--", ssh_target(host), remote]


def judge(check: HostCheck, expected: tuple[str, str]) -> str | None:
    """The problem with ``check`` in one paragraph, or None if the host is fine."""
    if check.returncode != 0:
        detail = check.stderr.strip() or check.stdout.strip() or "(no output)"
        what = "is not reachable over ssh" if check.returncode == 255 else f"failed the check (status {check.returncode})"
        return f"{check.host} {what}:\n    " + detail.replace("\n", "\n    ")
    for line in check.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == TAG:
            got = (parts[1], parts[2])
            if got != expected:
                return (
                    f"{check.host} runs Python {got[0]} / zerorun {got[1]}, "
                    f"this machine Python {expected[0]} / zerorun {expected[1]}"
                )
            return None
    return f"{check.host}: unexpected answer to the version probe: {check.stdout.strip()!r}"


def _run(argv: list[str], host: str, timeout: float) -> HostCheck:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return HostCheck(host, 255, "", f"no answer within {timeout:.0f} s")
    return HostCheck(host, done.returncode, done.stdout, done.stderr)


def ssh_check(plan: LaunchPlan, ssh: SshOptions) -> None:
    """Every node reachable, with the working directory and this machine's Python and zerorun;
    raise PreflightError naming each failing host."""
    expected = local_versions()
    timeout = ssh.connect_timeout + 30.0
    with ThreadPoolExecutor(max_workers=min(64, len(plan.nodes))) as pool:
        checks = list(pool.map(lambda n: _run(check_argv(plan, n.host, ssh), n.host, timeout), plan.nodes))
    problems = [p for p in (judge(c, expected) for c in checks) if p]
    if problems:
        raise PreflightError(
            "preflight failed before any rank started:\n  " + "\n  ".join(problems),
            "fix ssh access (passwordless, BatchMode), install the same Python/zerorun in the same path, "
            "or skip the checks with --no_ssh_check",
        )


def preflight(plan: LaunchPlan, ssh: SshOptions) -> tuple[dict[int, str], tuple[str, ...]]:
    """Check every node in parallel; raise PreflightError naming each failing host.

    The ssh check and (several nodes) the doctor's network checks run at the same time, so
    the network part costs about nothing on top; the ssh check's verdict comes first.
    Returns the interfaces to export (launcher/plan/ifname.py: ``{node_rank: interface}`` and the
    variables the user left unset; empty for one node), already said on stderr."""
    with ThreadPoolExecutor(max_workers=1) as side:
        doctor = side.submit(check_hosts, plan, RunnerKind.SSH, ssh) if len(plan.nodes) > 1 else None
        ssh_check(plan, ssh)
        report = doctor.result() if doctor is not None else None
    if report is None:
        return {}, ()
    judge_network(report)
    _, ifnames, variables = export_ifnames(plan, [h.facts for h in report.hosts])
    return ifnames, variables


def network_preflight(plan: LaunchPlan, ssh: SshOptions) -> DoctorReport:
    """The doctor's checks of a multi-node plan; raise PreflightError with every error's class and fix."""
    return judge_network(check_hosts(plan, RunnerKind.SSH, ssh))


def judge_network(report: DoctorReport) -> DoctorReport:
    """Print the doctor's warnings; raise PreflightError with every error's class and fix."""
    for f in report.findings:
        if not f.error:
            print(f"zerorun: warning: [{f.problem.value}] {f.message} (fix: {f.fix})", file=sys.stderr)
    errors = [f for f in report.findings if f.error]
    if errors:
        raise PreflightError(
            "preflight failed before any rank started:\n  "
            + "\n  ".join(f"[{f.problem.value}] {f.message}\n    fix: {f.fix}" for f in errors),
            "fix the above (`zerorun doctor` with the same hostfile shows every check), or skip the checks "
            "with --no_preflight",
        )
    return report
