"""``--nnodes MIN:MAX`` with ``--max_restarts``: a lost node costs one restart, not the job.

Each attempt runs as ``launcher/elastic/restarts.py`` runs one (its own job id, key, live view and
summary). After a failure the gang is torn down as always; then every host of the pool
that is not out for good is checked with the doctor's cheap checks (``check_hosts``:
reachable, versions, the master port; over ssh/pdsh only - a local or slurm/openmpi run
has nothing to probe), launcher/elastic/membership.py picks the next members (the failing
node sits out; the largest valid world with at least MIN nodes), and the ranks start
again with ``ZERORUN_ELASTIC=1``: the engine keeps ``train_batch_size`` by re-deriving
the accumulation (or takes the batch from an ``elasticity`` block) and ``load_checkpoint``
reshards to the new world. Every change of membership is one line; the end of the run
prints one row per attempt.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from launcher.doctor.hosts import DoctorReport
from launcher.elastic.membership import (
    Change,
    Membership,
    NodeRange,
    WorldCheck,
    change_line,
    parse_nnodes,
    world_of,
)
from launcher.elastic.restarts import RestartPolicy, run_with_restarts
from launcher.errors import LaunchError
from launcher.plan.filters import NodeSlots
from launcher.plan.ifname import export_ifnames
from launcher.plan.launch_plan import LaunchPlan, build_plan
from launcher.plan.master import plan_master
from launcher.plan.port import free_port
from launcher.plan.runners import NodeCommand, RunnerKind, SshOptions
from launcher.run.executor import RunResult
from launcher.watch.report import Failure
from launcher.watch.watcher import RunWatch

ELASTIC_ENV = "ZERORUN_ELASTIC"
"""The ranks' signal to keep the global batch at whatever world they start at (zerorun.engine.api)."""


def add_elastic_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--nnodes", metavar="MIN:MAX",
                       help="elastic: run on MIN to MAX nodes of the hostfile (torchrun's spelling); with "
                            "--max_restarts a failed node is dropped and the run restarts at the largest valid "
                            "world, keeping train_batch_size")
    group.add_argument("--min_nodes", type=int, help="elastic: the fewest nodes to run on (= --nnodes MIN:)")
    group.add_argument("--max_nodes", type=int, help="elastic: the most nodes to run on (= --nnodes :MAX)")
    group.add_argument("--rejoin", action="store_true",
                       help="elastic: a dropped host that answers the checks again joins at the next restart")


def node_range(ns: argparse.Namespace) -> NodeRange | None:
    return parse_nnodes(ns.nnodes, ns.min_nodes, ns.max_nodes)


def world_check(configs: list[str]) -> WorldCheck:
    """Whether every engine config the launcher can see runs at a world, keeping its global batch."""

    def check(world: int) -> str | None:
        if not configs:
            return None
        from zerorun.config import load_config
        from zerorun.config.problems import ConfigError

        for path in configs:
            try:
                load_config(path, world_size=world, keep_global_batch=True)
            except ConfigError as err:  # the first problem, as the config's reader words it
                return err.problems[0].render(err.origin) if err.problems else str(err)
        return None

    return check


@dataclass
class Attempt:
    """One row of the membership summary."""

    hosts: tuple[str, ...]
    world: int
    ended: str = "running"


@dataclass
class ElasticRun:
    """Everything an elastic launch needs from main: how to plan, to build commands and to watch."""

    ns: argparse.Namespace
    membership: Membership
    policy: RestartPolicy
    kind: RunnerKind
    ssh: SshOptions
    local: bool
    check: WorldCheck
    plan_of: Callable[[tuple[NodeSlots, ...]], LaunchPlan]
    commands_for: Callable[[LaunchPlan], list[NodeCommand]]
    watch_for: Callable[[LaunchPlan], RunWatch] | None = None
    err: TextIO = field(default_factory=lambda: sys.stderr)
    attempts: list[Attempt] = field(default_factory=list)
    facts: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """The last host checks' facts per host: a restarted node's ranks get its route's interface."""

    def say(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def run(self, members: tuple[NodeSlots, ...]) -> RunResult:
        """The attempts (restarts.run_with_restarts), each on the members the last failure left."""
        current = [members]

        def plan_for(restart: int) -> LaunchPlan:  # run_with_restarts adds the fresh key and the restart count
            plan = with_elastic_env(self.plan_of(current[0]))
            if restart and self.facts:  # the first plan has its interfaces from the preflight already
                plan = export_ifnames(plan, [self.facts.get(n.host) for n in plan.nodes])[0]
            self.attempts.append(Attempt(tuple(n.host.name for n in current[0]), world_of(current[0])))
            return plan

        def before_restart(result: RunResult, restart: int) -> str | None:
            self.attempts[-1].ended = _ended(result)
            change = self.next_members(current[0], result.failures[0])
            if change is None:
                self.say(f"zerorun: giving up: {self.membership.no_world(self.check)}")
                return None
            line = change_line(current[0], change)
            current[0] = change.members
            return line or ""

        result = run_with_restarts(plan_for, self.commands_for, self.policy, self.err, self.watch_for, before_restart)
        self.attempts[-1].ended = _ended(result)
        self.say(self.summary())
        return result

    def next_members(self, members: tuple[NodeSlots, ...], failure: Failure) -> Change | None:
        failed = _failed_host(members, failure)
        return self.membership.after_failure(members, failed, failure.exit_code, self.unhealthy(), self.check)

    def unhealthy(self) -> dict[str, str]:
        """Host -> the first error of the doctor's checks, for every host still in the pool (ssh/pdsh only)."""
        if self.kind not in (RunnerKind.SSH, RunnerKind.PDSH) or self.ns.no_ssh_check:
            return {}
        from launcher.doctor.hosts import check_hosts

        candidates = tuple(n for n in self.membership.pool if n.host.name not in self.membership.gone)
        report = check_hosts(check_plan(self.plan_of(candidates[:1]), candidates, self.ns, self.local),
                             self.kind, self.ssh)
        self.facts = {h.host: h.facts for h in report.hosts}
        bad = failing_hosts(report)
        self.say(f"zerorun: checked {len(candidates)} host(s) in {report.seconds:.1f} s: "
                 + (f"failing {', '.join(bad)}" if bad else "every one answers"))
        return bad

    def summary(self) -> str:
        lines = [f"zerorun: elastic membership (--nnodes {self.membership.rng}), one row per attempt:",
                 f"  {'attempt':>7}  {'nodes':>5}  {'world':>5}  {'hosts':<40} ended"]
        for i, a in enumerate(self.attempts):
            lines.append(f"  {i:>7}  {len(a.hosts):>5}  {a.world:>5}  {','.join(a.hosts)[:40]:<40} {a.ended}")
        return "\n".join(lines)


def failing_hosts(report: DoctorReport) -> dict[str, str]:
    """Host -> the first error the checks found there."""
    bad: dict[str, str] = {}
    for finding in report.findings:
        if finding.error and finding.host not in bad:
            bad[finding.host] = f"[{finding.problem.value}] {finding.message}"
    return bad


def checked_start(run: ElasticRun, members: tuple[NodeSlots, ...], plan: LaunchPlan
                  ) -> tuple[tuple[NodeSlots, ...], LaunchPlan, tuple[dict[int, str], tuple[str, ...]]]:
    """The launch's preflight, elastic: a host that fails it sits out (one line) while a valid world is left.

    Returns the first attempt's members, their plan and the interfaces the preflight found.
    """
    from launcher.doctor.hosts import check_hosts
    from launcher.doctor.preflight import preflight
    from launcher.errors import PreflightError

    while True:
        try:
            return members, plan, preflight(plan, run.ssh)
        except PreflightError:
            bad = failing_hosts(check_hosts(plan, run.kind, run.ssh))
            if not bad:
                raise
        run.membership.sitting_out.update(bad)
        run.say("zerorun: membership: before the start: " + ", ".join(f"{h} out ({why})" for h, why in bad.items()))
        members = run.membership.first(run.check)  # a LaunchError naming every host out when too few are left
        plan = run.plan_of(members)


def _failed_host(members: tuple[NodeSlots, ...], failure: Failure) -> str | None:
    if failure.node_rank is not None and 0 <= failure.node_rank < len(members):
        return members[failure.node_rank].host.name
    return next((n.host.name for n in members if failure.host in (n.host.name, n.host.address)), None)


def _ended(result: RunResult) -> str:
    if not result.failures:
        return f"exit code {result.exit_code}"
    f = result.failures[0]
    who = "the command" if f.rank is None else f"rank {f.rank}"
    return f"{who} on {f.host} failed ({f.describe_code()})"


def with_elastic_env(plan: LaunchPlan) -> LaunchPlan:
    """The plan with ``ZERORUN_ELASTIC=1`` in every rank's environment."""
    env = dict(plan.env)
    env[ELASTIC_ENV] = "1"
    return dataclasses.replace(plan, env=tuple(sorted(env.items())))


def check_plan(base: LaunchPlan, nodes: tuple[NodeSlots, ...], ns: argparse.Namespace, local: bool) -> LaunchPlan:
    """A plan of every candidate host, only to check them (no config is validated at its world)."""
    addr, reason = plan_master(nodes, ns.master_addr, local)
    return build_plan(nodes, command=base.command, job_id=base.job_id, cwd=base.cwd, python=base.python,
                      master_addr=addr, master_reason=reason, local=local, env=dict(base.env), options=base.options,
                      master_port=free_port() if ns.master_port == "auto" else base.master_port)


def start(ns: argparse.Namespace, rng: NodeRange, pool: tuple[NodeSlots, ...]) -> Membership:
    """The membership of an elastic launch (``--max_restarts 0``: one attempt, on the largest valid world)."""
    if ns.num_nodes is not None:
        raise LaunchError("--num_nodes and --nnodes both say how many nodes", "keep one: --nnodes MIN:MAX is elastic")
    return Membership(pool, rng, rejoin=ns.rejoin)
