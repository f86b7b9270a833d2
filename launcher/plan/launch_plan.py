"""The launch plan: pure data describing the world (nodes, ranks, env of every rank).

Nodes keep hostfile order; global ranks are contiguous per node; LOCAL_RANK is the
rank's position on its node (not ``RANK % n``, which is wrong for nodes with
different slot counts). The plan travels to every node's agent as JSON, so the
agent computes each rank's env with the same pure functions the dry-run prints.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from launcher.errors import LaunchError
from launcher.plan.filters import NodeSlots
from launcher.plan.hostnames import address_problem
from launcher.plan.master import check_explicit, is_loopback, remote_nodes

DEFAULT_MASTER_PORT = 29500


class DeviceMode(str, Enum):
    """How an agent decides whether to set CUDA_VISIBLE_DEVICES for its ranks."""

    AUTO = "auto"
    """Set it when the node has NVIDIA GPUs (checked by the agent on that node)."""
    GPU = "gpu"
    """Always set it: slot ids are GPU ids."""
    CPU = "cpu"
    """Never set it: CPU ranks (gloo)."""


@dataclass(frozen=True)
class NodePlan:
    """One node: the ssh target as written in the hostfile, its slots and global ranks."""

    host: str
    address: str
    node_rank: int
    slots: tuple[int, ...]
    ranks: tuple[int, ...]
    env: tuple[tuple[str, str], ...] = ()
    """Variables only this node's ranks get, over the plan's (the interface of this node's route to
    the master, launcher/plan/ifname.py)."""


@dataclass(frozen=True)
class AgentOptions:
    """How the agents run and watch the ranks."""

    kill_timeout: float = 10.0
    """Seconds between SIGTERM and SIGKILL when tearing the ranks down."""
    log_dir: str | None = None
    """Absolute directory for per-rank log files (``rank<R>.log``); output is still teed."""
    console_ranks: tuple[int, ...] | None = None
    """Global ranks whose output reaches the console (None = all)."""
    color: bool = False
    """Colour the ``[host:rank]`` prefixes (the launcher's stdout is a terminal)."""
    devices: DeviceMode = DeviceMode.AUTO
    bind_cores: bool = False
    """Pin each local rank to its own share of the node's cores (``--bind_cores_to_rank``)."""
    bind_core_list: str | None = None
    """The cores to share out (``--bind_core_list "0,2-5"``); default: the agent's own affinity."""
    threads_per_rank: int | None = None
    """``OMP_NUM_THREADS`` of every rank (``--threads_per_rank``); None: the user's, else the rank's
    share of its node's cores (launcher/plan/threads.py)."""


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the agents need; ``env`` holds exported values (never printed)."""

    job_id: str
    nodes: tuple[NodePlan, ...]
    master_addr: str
    master_port: int
    master_reason: str
    command: tuple[str, ...]
    pass_local_rank: bool
    cwd: str
    python: str
    env: tuple[tuple[str, str], ...] = ()
    options: AgentOptions = AgentOptions()
    args_start: int | None = None
    """Index in ``command`` where the script's own arguments start (``--local_rank=N`` goes there)."""
    visible_devices: tuple[str, ...] = ()
    """A local launch's inherited ``CUDA_VISIBLE_DEVICES``: slot ``s`` is GPU ``visible_devices[s]``
    (empty: slot ids are GPU ids)."""
    channel_key: str = ""
    """This attempt's secret that authenticates the agents' events (launcher/protocol.py); never
    printed, never in a rank's env."""

    @property
    def world_size(self) -> int:
        return sum(len(n.ranks) for n in self.nodes)

    def node(self, node_rank: int) -> NodePlan:
        return self.nodes[node_rank]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["options"]["devices"] = self.options.devices.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        opts = dict(data["options"])
        opts["devices"] = DeviceMode(opts["devices"])
        if opts.get("console_ranks") is not None:
            opts["console_ranks"] = tuple(opts["console_ranks"])
        nodes = tuple(
            NodePlan(n["host"], n["address"], n["node_rank"], tuple(n["slots"]), tuple(n["ranks"]),
                     tuple((k, v) for k, v in n.get("env", ()))) for n in data["nodes"]
        )
        return cls(
            job_id=data["job_id"],
            nodes=nodes,
            master_addr=data["master_addr"],
            master_port=int(data["master_port"]),
            master_reason=data["master_reason"],
            command=tuple(data["command"]),
            pass_local_rank=bool(data["pass_local_rank"]),
            cwd=data["cwd"],
            python=data["python"],
            env=tuple((k, v) for k, v in data["env"]),
            options=AgentOptions(**opts),
            args_start=data.get("args_start"),
            visible_devices=tuple(data.get("visible_devices", ())),
            channel_key=str(data.get("channel_key", "")),
        )


def new_job_id() -> str:
    """A fresh job id (48 random bits): names the attempt's plan folder, so it is never reused."""
    return secrets.token_hex(6)


def choose_master(nodes: Sequence[NodeSlots], master_addr: str | None, local: bool) -> tuple[str, str]:
    """The master address and why it was chosen; never a loopback master with a remote node
    (launcher/plan/master.py replaces a loopback first node before the plan is built)."""
    if master_addr:
        problem = address_problem(master_addr)
        if problem is not None and address_problem(f"[{master_addr}]") is not None:  # a bare IPv6 is fine here
            raise LaunchError(f"--master_addr {master_addr[:80]!r}: {problem}", "give the host name or address of rank 0's node")
        check_explicit(master_addr, nodes)
        return master_addr, "given by --master_addr"
    if local:
        return "127.0.0.1", "single local node: loopback"
    first = nodes[0].host
    remote = remote_nodes(nodes)
    if is_loopback(first.address) and remote:
        raise LaunchError(f"the first node of the hostfile ({first.name}) is loopback and {remote[0]} is remote",
                          "write this machine's routable name or address in the hostfile, or pass --master_addr")
    return first.address, f"first node of the hostfile ({first.name}): rank 0 runs there and hosts the store"


def build_plan(
    nodes: Sequence[NodeSlots],
    *,
    command: Sequence[str],
    job_id: str,
    cwd: str,
    python: str,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    port_reason: str | None = None,
    master_reason: str | None = None,
    local: bool = False,
    pass_local_rank: bool = False,
    env: dict[str, str] | None = None,
    options: AgentOptions = AgentOptions(),
    args_start: int | None = None,
    visible_devices: tuple[str, ...] = (),
    channel_key: str = "",
) -> LaunchPlan:
    """Lay out ranks over ``nodes`` (hostfile order, contiguous per node)."""
    addr, reason = choose_master(nodes, master_addr, local)
    reason = master_reason or reason
    if port_reason:
        reason = f"{reason}; port {port_reason}"
    node_plans: list[NodePlan] = []
    next_rank = 0
    for node_rank, node in enumerate(nodes):
        ranks = tuple(range(next_rank, next_rank + len(node.slots)))
        next_rank += len(ranks)
        node_plans.append(NodePlan(node.host.name, node.host.address, node_rank, tuple(node.slots), ranks))
    return LaunchPlan(
        job_id=job_id,
        nodes=tuple(node_plans),
        master_addr=addr,
        master_port=master_port,
        master_reason=reason,
        command=tuple(command),
        pass_local_rank=pass_local_rank,
        cwd=cwd,
        python=python,
        env=tuple(sorted((env or {}).items())),
        options=options,
        args_start=args_start,
        visible_devices=visible_devices,
        channel_key=channel_key,
    )


def rank_env(plan: LaunchPlan, node_rank: int, local_rank: int, has_gpu: bool) -> dict[str, str]:
    """The variables one rank gets on top of its node's environment."""
    node = plan.node(node_rank)
    env = dict(plan.env)
    env.update(node.env)
    env.update(
        RANK=str(node.ranks[local_rank]),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(plan.world_size),
        LOCAL_WORLD_SIZE=str(len(node.ranks)),
        LOCAL_SIZE=str(len(node.ranks)),
        NODE_RANK=str(node_rank),
        GROUP_RANK=str(node_rank),
        CROSS_RANK=str(node_rank),
        CROSS_SIZE=str(len(plan.nodes)),
        GROUP_WORLD_SIZE=str(len(plan.nodes)),
        MASTER_ADDR=plan.master_addr,
        MASTER_PORT=str(plan.master_port),
        ZERORUN_JOB_ID=plan.job_id,
        PYTHONUNBUFFERED="1",
    )
    if has_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot_devices(plan, node))
    return env


def slot_devices(plan: LaunchPlan, node: NodePlan) -> tuple[str, ...]:
    """The GPU ids of ``node``'s slots: the inherited visible ids of a local launch, else the slots."""
    if plan.visible_devices:
        return tuple(plan.visible_devices[s] for s in node.slots)
    return tuple(str(s) for s in node.slots)


def rank_argv(plan: LaunchPlan, local_rank: int | str) -> list[str]:
    """The rank's command: the user's arguments untouched, plus ``--local_rank=N`` if asked.

    As DeepSpeed's launcher does, the flag goes right after the script, before its own
    arguments (``args_start``; at the end when the plan does not say where they start).
    """
    argv = list(plan.command)
    if plan.pass_local_rank:
        argv.insert(len(argv) if plan.args_start is None else plan.args_start, f"--local_rank={local_rank}")
    return argv
