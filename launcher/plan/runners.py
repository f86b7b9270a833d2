"""Runners turn a plan into one command per node: pure functions with exact argv.

``local`` and ``ssh`` start ``python -m launcher.run.agent --node_rank K`` per node and
send the plan on its stdin; ``pdsh`` cannot carry stdin, so its agents read the plan
from a 0600 file in the (shared) working directory and delete it. ``slurm`` and
``openmpi`` hand the whole job to ``srun``/``mpirun``, which start
``python -m launcher.run.shim`` per rank; the shim maps SLURM_*/OMPI_* to RANK etc.
Commands are argument lists; ``shlex.quote`` happens only where a remote shell reads
the text (ssh and pdsh), and pdsh's ``%`` substitutions are escaped. Every ssh
destination comes after ``--`` (pdsh's too, through its ssh template), and hosts
passed the grammar of launcher/plan/hostnames.py: a host is never read as an option.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan
from launcher.protocol import KEY_ENV


class RunnerKind(str, Enum):
    """The ``--launcher`` choices."""

    LOCAL = "local"
    SSH = "ssh"
    PDSH = "pdsh"
    SLURM = "slurm"
    OPENMPI = "openmpi"


class PayloadMode(str, Enum):
    """How a node's agent receives the plan (with the env values)."""

    STDIN = "stdin"
    FILE = "file"
    NONE = "none"
    """No agent: srun/mpirun inherit the env from the launcher's process."""


@dataclass(frozen=True)
class SshOptions:
    """Options for every ssh this launcher (or pdsh) runs."""

    port: int | None = None
    args: tuple[str, ...] = ()
    connect_timeout: int = 10

    def options(self) -> list[str]:
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}"]
        if self.port is not None:
            opts += ["-p", str(self.port)]
        return opts + list(self.args)


@dataclass(frozen=True)
class NodeCommand:
    """One process the executor starts: an agent for a node, or srun/mpirun for all."""

    argv: tuple[str, ...]
    node_rank: int | None
    host: str
    payload: PayloadMode
    payload_path: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    remote: bool = True
    """False for the local runner: its rank pids are this machine's, so the launcher can
    kill their process groups itself if the agent had to be killed first."""


PDSH_SSH_ARGS = "-2 -a -x -l%u -- %h"
"""pdsh's own ssh template with ``--`` before the host (``%u``/``%h``: pdsh fills in the user and host)."""


def ssh_target(host: str) -> str:
    """The hostfile name as ssh wants it: ``user@[fe80::1]`` -> ``user@fe80::1``."""
    user, at, addr = host.rpartition("@")
    addr = addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr
    return f"{user}{at}{addr}"


def agent_argv(plan: LaunchPlan, node_rank: int, payload_path: str | None = None) -> list[str]:
    argv = [plan.python, "-u", "-m", "launcher.run.agent", "--node_rank", str(node_rank)]
    if payload_path is not None:
        argv += ["--payload", payload_path]
    return argv


def remote_shell_command(plan: LaunchPlan, argv: list[str]) -> str:
    """The one string a remote shell runs: ``cd CWD && exec ARGV`` with every token quoted."""
    return f"cd {shlex.quote(plan.cwd)} && exec {shlex.join(argv)}"


def payload_file(payload_dir: str, node_rank: int) -> str:
    return f"{payload_dir.rstrip('/')}/node{node_rank}.json"


def local_commands(plan: LaunchPlan) -> list[NodeCommand]:
    return [NodeCommand(tuple(agent_argv(plan, 0)), 0, plan.nodes[0].host, PayloadMode.STDIN, remote=False)]


def ssh_commands(plan: LaunchPlan, ssh: SshOptions) -> list[NodeCommand]:
    commands = []
    for node in plan.nodes:
        remote = remote_shell_command(plan, agent_argv(plan, node.node_rank))
        argv = ["ssh", "-T", *ssh.options(), "--", ssh_target(node.host), remote]
        commands.append(NodeCommand(tuple(argv), node.node_rank, node.host, PayloadMode.STDIN))
    return commands


def pdsh_commands(plan: LaunchPlan, ssh: SshOptions, payload_dir: str, launcher_args: tuple[str, ...] = ()) -> list[NodeCommand]:
    """One ``pdsh -S`` per node, so each command carries its node rank explicitly."""
    env = (("PDSH_RCMD_TYPE", "ssh"), ("PDSH_SSH_ARGS", PDSH_SSH_ARGS),
           ("PDSH_SSH_ARGS_APPEND", shlex.join(ssh.options())))
    commands = []
    for node in plan.nodes:
        path = payload_file(payload_dir, node.node_rank)
        remote = remote_shell_command(plan, agent_argv(plan, node.node_rank, path)).replace("%", "%%")
        argv = ["pdsh", "-S", "-N", "-R", "ssh", "-f", "1", *launcher_args, "-w", ssh_target(node.host), remote]
        commands.append(NodeCommand(tuple(argv), node.node_rank, node.host, PayloadMode.FILE, path, env))
    return commands


def _shim_argv(plan: LaunchPlan) -> list[str]:
    argv = [plan.python, "-u", "-m", "launcher.run.shim"]
    if plan.pass_local_rank:
        argv.append("--pass_local_rank" if plan.args_start is None else f"--pass_local_rank={plan.args_start}")
    return [*argv, "--", *plan.command]


def job_env(plan: LaunchPlan) -> dict[str, str]:
    """What srun/mpirun must carry to every rank (the shim derives the rest)."""
    env = dict(plan.env)
    env.update(
        MASTER_ADDR=plan.master_addr, MASTER_PORT=str(plan.master_port),
        ZERORUN_JOB_ID=plan.job_id, PYTHONUNBUFFERED="1",
        ZERORUN_NODES=",".join(f"{n.address}:{len(n.ranks)}" for n in plan.nodes),
        ZERORUN_KILL_TIMEOUT=str(plan.options.kill_timeout),
    )
    env[KEY_ENV] = plan.channel_key  # for the shims' events; each shim removes it before its rank starts
    return env


def _uniform_slots(plan: LaunchPlan, runner: str) -> int:
    counts = {len(n.ranks) for n in plan.nodes}
    if len(counts) != 1:
        raise LaunchError(
            f"the {runner} runner needs the same number of ranks on every node, got {sorted(counts)}",
            "use --launcher ssh or pdsh for nodes with different slot counts, or --num_gpus to even them",
        )
    return counts.pop()


def slurm_commands(plan: LaunchPlan, launcher_args: tuple[str, ...] = ()) -> list[NodeCommand]:
    per_node = _uniform_slots(plan, "slurm")
    argv = [
        "srun", "--kill-on-bad-exit=1", f"--nodes={len(plan.nodes)}", f"--ntasks={plan.world_size}",
        f"--ntasks-per-node={per_node}", f"--nodelist={','.join(n.address for n in plan.nodes)}",
        "--export=ALL", *launcher_args, *_shim_argv(plan),
    ]
    env = tuple(sorted(job_env(plan).items()))
    return [NodeCommand(tuple(argv), None, "srun", PayloadMode.NONE, None, env)]


def check_mpirun_as_root(launcher_args: tuple[str, ...], env: Mapping[str, str], euid: int) -> None:
    """Open MPI refuses to run as root unless told twice; say so before anything starts."""
    allowed = "--allow-run-as-root" in launcher_args or (
        env.get("OMPI_ALLOW_RUN_AS_ROOT") == "1" and env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1")
    if euid == 0 and not allowed:
        raise LaunchError(
            "--launcher openmpi as root: mpirun refuses to run as root unless it is allowed explicitly",
            "run as another user, or pass --launcher_args --allow-run-as-root, or export "
            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (containers often run as root)",
        )


def openmpi_commands(plan: LaunchPlan, ssh: SshOptions = SshOptions(), launcher_args: tuple[str, ...] = ()
                     ) -> list[NodeCommand]:
    """``-x NAME`` (no value) exports the variable from mpirun's own environment; mpirun's
    ssh gets the launcher's ssh options (``plm_rsh_args`` splits them on spaces)."""
    hosts = ",".join(f"{n.address}:{len(n.ranks)}" for n in plan.nodes)
    env = job_env(plan)
    exports = [item for name in sorted(env) for item in ("-x", name)]
    argv = [
        "mpirun", "-np", str(plan.world_size), "--host", hosts, "--bind-to", "none", "--wdir", plan.cwd,
        "--mca", "plm_rsh_args", " ".join(ssh.options()), *launcher_args, *exports, *_shim_argv(plan),
    ]
    return [NodeCommand(tuple(argv), None, "mpirun", PayloadMode.NONE, None, tuple(sorted(env.items())))]


def build_commands(
    plan: LaunchPlan,
    kind: RunnerKind,
    ssh: SshOptions = SshOptions(),
    payload_dir: str = ".zerorun",
    launcher_args: tuple[str, ...] = (),
) -> list[NodeCommand]:
    """The commands that run ``plan`` with runner ``kind``."""
    if kind is RunnerKind.LOCAL:
        if len(plan.nodes) != 1:
            raise LaunchError(
                f"--launcher local runs one node, the plan has {len(plan.nodes)}",
                "use --launcher ssh or pdsh for several nodes",
            )
        return local_commands(plan)
    if kind is RunnerKind.SSH:
        return ssh_commands(plan, ssh)
    if kind is RunnerKind.PDSH:
        return pdsh_commands(plan, ssh, payload_dir, launcher_args)
    if kind is RunnerKind.SLURM:
        return slurm_commands(plan, launcher_args)
    return openmpi_commands(plan, ssh, launcher_args)
