"""``zerorun [launcher options] SCRIPT [args]``: hostfile -> filters -> plan -> commands -> run.

Everything up to the commands is pure and checked before anything starts; only the
preflight (ssh) and the executor touch other processes or hosts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

from launcher.args import parse_args, parse_rank_list
from launcher.doctor.preflight import preflight
from launcher.elastic.restarts import RestartPolicy, run_with_restarts
from launcher.elastic.supervisor import ElasticRun, checked_start, node_range, world_check
from launcher.elastic.supervisor import start as start_membership
from launcher.errors import FilterError, LaunchError
from launcher.plan.affinity import available_cores, core_share
from launcher.plan.allocation import allocation_hosts
from launcher.plan.devices import gpu_count, local_gpus, visible_devices
from launcher.plan.envpolicy import collect_env, default_env_files
from launcher.plan.filters import NodeSlots, check_exclusive, limit, select
from launcher.plan.hostfile import Host, find_hosts
from launcher.plan.ifname import with_ifnames
from launcher.plan.launch_plan import AgentOptions, DeviceMode, LaunchPlan, build_plan, new_job_id
from launcher.plan.master import plan_master
from launcher.plan.port import choose_port
from launcher.plan.runners import NodeCommand, RunnerKind, SshOptions, build_commands, check_mpirun_as_root
from launcher.plan.threads import say_threads
from launcher.protocol import new_key
from launcher.script_path import missing_script
from launcher.watch.display import dump_json, plan_json, plan_text
from launcher.watch.watch_args import watch_factory
from zerorun.compat import ENV_VAR as COMPAT_ENV

_BINARIES = {RunnerKind.SSH: "ssh", RunnerKind.PDSH: "pdsh", RunnerKind.SLURM: "srun", RunnerKind.OPENMPI: "mpirun"}
_DS_CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed", "--config")


def local_nodes(ns: argparse.Namespace) -> tuple[NodeSlots, ...]:
    """This machine as the one node: its GPUs (those an inherited CUDA_VISIBLE_DEVICES lists),
    or ``--num_gpus`` CPU ranks without GPUs."""
    gpus = len(local_gpus(os.environ, gpu_count()))
    if gpus and ns.num_gpus and ns.num_gpus > gpus:
        raise FilterError(f"--num_gpus {ns.num_gpus} is larger than the {gpus} GPU(s) this job may use here "
                          f"({_gpus_reason()})",
                          f"use --num_gpus {gpus} or fewer")
    host = Host("localhost", ns.num_gpus or gpus or 1)
    return select((host,), ns.include, ns.exclude)


def _gpus_reason() -> str:
    visible = visible_devices(os.environ)
    return "all of this machine's" if visible is None else f"CUDA_VISIBLE_DEVICES={','.join(visible)!r}"


def resolve_nodes(ns: argparse.Namespace) -> tuple[tuple[NodeSlots, ...], bool]:
    """The selected nodes, and whether this machine alone runs the job (no hostfile)."""
    check_exclusive(ns.include, ns.exclude, ns.num_nodes, ns.num_gpus)
    hosts = find_hosts(ns.hostfile)
    if hosts is None and ns.launcher == RunnerKind.SLURM.value and (not ns.dry_run or "SLURM_JOB_NODELIST" in os.environ):
        hosts = allocation_hosts(os.environ, ns.num_gpus)  # inside salloc/sbatch the allocation is the hostfile
    if hosts is None:
        if ns.num_nodes is not None and ns.num_nodes > 1:
            raise FilterError(f"--num_nodes {ns.num_nodes} without a hostfile: only this machine is available",
                              "pass --hostfile with the other hosts")
        return local_nodes(ns), True
    return limit(select(hosts, ns.include, ns.exclude), ns.num_nodes, ns.num_gpus), False


def is_this_machine(address: str) -> bool:
    return address in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def choose_runner(ns: argparse.Namespace, nodes: tuple[NodeSlots, ...], local: bool) -> RunnerKind:
    """--launcher, else local for this machine alone, pdsh (if installed) for several nodes, else ssh."""
    if ns.launcher:
        kind = RunnerKind(ns.launcher)
    elif local or (len(nodes) == 1 and is_this_machine(nodes[0].host.address)):
        kind = RunnerKind.LOCAL
    else:
        kind = RunnerKind.PDSH if len(nodes) > 1 and shutil.which("pdsh") else RunnerKind.SSH
    binary = _BINARIES.get(kind)
    if binary and not shutil.which(binary) and not ns.dry_run:
        raise LaunchError(f"--launcher {kind.value} needs `{binary}`, which is not installed here",
                          "install it, or pick another --launcher (local, ssh, pdsh, slurm, openmpi)")
    return kind


def validate_config(path: str, world_size: int, flag: str, keep_global_batch: bool = False,
                    per_node: int | None = None) -> str:
    """Check the config file before any rank starts; return its absolute path.

    ``keep_global_batch``: an elastic launch, whose ranks keep train_batch_size at any world.
    ``per_node``: the ranks of a node, against which hpZ's and MiCS's group sizes are checked."""
    p = Path(path)
    if p.is_dir() or not p.exists():
        what = "is a directory, not a config file" if p.is_dir() else "does not exist"
        raise LaunchError(f"{flag} {path!r} {what}", "check the path of the config file")
    try:
        from zerorun.config import load_config
    except ImportError:
        print(f"zerorun: note: zerorun.config is not available, {flag} {path} was not validated", file=sys.stderr)
        return str(p.resolve())
    cfg = load_config(str(p), world_size=world_size, keep_global_batch=keep_global_batch)
    if per_node is not None:
        check_group_sizes(cfg.zero_optimization, world_size, per_node, f"{flag} {path}")
    return str(p.resolve())


def check_group_sizes(zero: object, world_size: int, per_node: int, where: str) -> None:
    """hpZ's and MiCS's groups must tile this world's nodes (zerorun.engine.comm.group_plan's rules)."""
    hpz, mics = getattr(zero, "zero_hpz_partition_size", 1), getattr(zero, "mics_shard_size", -1)
    hierarchical = getattr(zero, "mics_hierarchical_params_gather", False)
    if hpz <= 1 and mics <= 0 and not hierarchical:
        return
    from zerorun.engine.comm.group_plan import plan_groups
    from zerorun.errors import ZerorunError

    try:
        plan_groups(world_size, per_node, hpz, mics, hierarchical)
    except ZerorunError as e:
        raise LaunchError(f"{where}: {e.message} (a world of {world_size} ranks, {per_node} per node)",
                          e.hint) from e


def _flag_value(args: list[str], i: int) -> tuple[str, str | None]:
    """``(flag, value)`` of ``args[i]``: ``--flag=value`` or ``--flag value`` (None: no value)."""
    flag, eq, value = args[i].partition("=")
    if eq:
        return flag, value
    following = args[i + 1] if i + 1 < len(args) else ""
    return flag, following if following and not following.startswith("-") else None


def _is_engine_config(path: str) -> bool:
    """Whether an existing file given as the script's ``--config`` holds engine keys at all.

    A script's ``--config`` may name its own file (a model config, say); only a file
    with at least one top-level key of the engine's config is checked as one.
    """
    try:
        from zerorun.config.read import read_source
        from zerorun.config.schema import ZerorunConfig

        raw, _ = read_source(path)
    except Exception:  # unreadable or malformed: the engine reading it would fail the same way
        return True
    return bool(set(raw) & set(ZerorunConfig.model_fields))


def script_configs(script_args: list[str]) -> list[tuple[str, str]]:
    """``(flag, path)`` for each engine config among the script's args, as the engine finds them.

    ``--deepspeed_config FILE`` (or ``=FILE``) always; ``--config``/``--deepspeed`` when
    FILE ends in .json/.yaml/.yml (and, for an existing ``--config``, holds engine keys).
    """
    found = []
    for i in range(len(script_args)):
        flag, value = _flag_value(script_args, i)
        if flag not in _DS_CONFIG_FLAGS or not value:
            continue
        if flag != "--deepspeed_config" and Path(value).suffix not in (".json", ".yaml", ".yml"):
            continue
        if flag == "--config" and Path(value).is_file() and not _is_engine_config(value):
            continue
        found.append((flag, value))
    return found


def check_script(ns: argparse.Namespace, local: bool) -> None:
    """A local launch of a script file that does not exist fails here, not on every rank."""
    if ns.module or ns.no_python or not local or Path(ns.script).is_file():
        return
    raise missing_script(ns.script)


def rank_command(ns: argparse.Namespace) -> list[str]:
    if ns.no_python:
        return [ns.script, *ns.script_args]
    if ns.module:
        return [sys.executable, "-u", "-m", ns.script, *ns.script_args]
    return [sys.executable, "-u", ns.script, *ns.script_args]


def ssh_options(ns: argparse.Namespace) -> SshOptions:
    text = ns.ssh_args if ns.ssh_args is not None else os.environ.get("ZERORUN_SSH_ARGS", "")
    return SshOptions(port=ns.ssh_port, args=tuple(shlex.split(text)))


def runs_here(nodes: tuple[NodeSlots, ...], local: bool) -> bool:
    """Whether every rank runs on this machine (no hostfile, or one node that is this machine)."""
    return local or (len(nodes) == 1 and is_this_machine(nodes[0].host.address))


def make_plan(ns: argparse.Namespace, nodes: tuple[NodeSlots, ...], local: bool,
              check_port: bool = True) -> tuple[LaunchPlan, str | None]:
    """The plan; ``check_port``: a ``--master_port`` taken here stops the launch (not for a dry run or doctor)."""
    world_size = sum(len(n.slots) for n in nodes)
    keep = node_range(ns) is not None
    per_node = max((len(n.slots) for n in nodes), default=1)
    config = validate_config(ns.config, world_size, "--config", keep, per_node) if ns.config else None
    for flag, path in script_configs(ns.script_args):
        validate_config(path, world_size, f"{flag} (a script argument)", keep, per_node)
    cwd = Path.cwd()
    env = collect_env(os.environ, default_env_files(cwd, Path.home()), ns.env, Path(ns.env_file) if ns.env_file else None)
    if config:
        env["ZERORUN_CONFIG"] = config
    if ns.as_deepspeed:
        env[COMPAT_ENV] = "1"
    if ns.debug:
        env["ZERORUN_DEBUG"] = "1"
    port, port_reason = choose_port(ns.master_port, runs_here(nodes, local), check_port)
    devices = DeviceMode(ns.devices)
    gpus = local_gpus(os.environ, gpu_count()) if local else ()
    if devices is DeviceMode.AUTO and local and not gpus:
        devices = DeviceMode.CPU
    if ns.bind_cores_to_rank and (local or ns.bind_core_list):
        for node in nodes:  # fail before any rank starts; remote cores are checked by their agent
            core_share(available_cores(ns.bind_core_list), 0, len(node.slots))
    color = ns.color == "always" or (ns.color == "auto" and sys.stdout.isatty())
    options = AgentOptions(
        kill_timeout=ns.kill_timeout, log_dir=str(Path(ns.log_dir).resolve()) if ns.log_dir else None,
        console_ranks=parse_rank_list(ns.ranks) if ns.ranks else None, color=color, devices=devices,
        bind_cores=ns.bind_cores_to_rank, bind_core_list=ns.bind_core_list, threads_per_rank=ns.threads_per_rank,
    )
    command = rank_command(ns)
    master_addr, master_reason = plan_master(nodes, ns.master_addr, local)
    plan = build_plan(
        nodes, command=command, args_start=len(command) - len(ns.script_args), job_id=new_job_id(), cwd=str(cwd), python=sys.executable,
        master_addr=master_addr, master_port=port, port_reason=port_reason, master_reason=master_reason, local=local,
        pass_local_rank=ns.pass_local_rank, env=env, options=options,
        visible_devices=gpus if visible_devices(os.environ) is not None else (), channel_key=new_key(),
    )
    return plan, config


def commands_for(ns: argparse.Namespace, plan: LaunchPlan, kind: RunnerKind) -> list[NodeCommand]:
    payload_dir = str(Path(plan.cwd) / ".zerorun" / plan.job_id)
    return build_commands(plan, kind, ssh_options(ns), payload_dir, tuple(shlex.split(ns.launcher_args)))


def main(argv: list[str]) -> int:
    """Launch; return the exit status (the first failing rank's, 128+N for a signal)."""
    ns = parse_args(argv)
    policy = RestartPolicy(ns.max_restarts, ns.restart_backoff)
    nodes, local = resolve_nodes(ns)
    elastic = node_range(ns)  # --nnodes MIN:MAX: the first attempt's nodes; the rest of the pool are spares
    membership = start_membership(ns, elastic, nodes) if elastic else None
    check = world_check([c for c in [ns.config, *(p for _, p in script_configs(ns.script_args))] if c])
    nodes = membership.first(check) if membership else nodes
    kind = choose_runner(ns, nodes, local)
    if not ns.dry_run:
        check_script(ns, local)
    plan, config = make_plan(ns, nodes, local, check_port=not ns.dry_run)
    commands = commands_for(ns, plan, kind)
    if ns.dry_run:
        text = dump_json(plan_json(plan, commands, kind)) if ns.json else plan_text(plan, commands, kind, config)
        with contextlib.suppress(BrokenPipeError):  # `zerorun --dry-run ... | head`
            print(text, flush=True)
        return 0
    if ns.json:
        raise LaunchError("--json only goes with --dry-run", "add --dry-run, or drop --json")
    if kind is RunnerKind.OPENMPI:
        check_mpirun_as_root(tuple(shlex.split(ns.launcher_args)), os.environ, os.geteuid())
    ifnames: tuple[dict[int, str], tuple[str, ...]] = ({}, ())
    elastic_run = ElasticRun(ns, membership, policy, kind, ssh_options(ns), local, check,
                             lambda m: plan if m == nodes else make_plan(ns, m, local)[0],
                             lambda p: commands_for(ns, p, kind), watch_factory(ns)) if membership else None
    if kind in (RunnerKind.SSH, RunnerKind.PDSH) and not ns.no_ssh_check:
        if elastic_run is not None:  # elastic: a host that fails the preflight sits out while MIN nodes remain
            nodes, plan, ifnames = checked_start(elastic_run, nodes, plan)
        else:
            ifnames = preflight(plan, ssh_options(ns))
        plan = with_ifnames(plan, *ifnames)
    say_threads(plan, local)
    if elastic_run is not None:
        return elastic_run.run(nodes).exit_code

    def plan_for(restart: int) -> LaunchPlan:  # `--master_port auto`: a fresh free port for every attempt
        return plan if restart == 0 or ns.master_port != "auto" else with_ifnames(make_plan(ns, nodes, local)[0], *ifnames)

    hints = (ns.misplaced,) if ns.misplaced else ()  # `zerorun train.py --num_gpus 2`: said if the script refuses it
    return run_with_restarts(plan_for, lambda p: commands_for(ns, p, kind), policy, watch_for=watch_factory(ns),
                             hints=hints).exit_code
