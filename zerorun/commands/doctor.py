"""`zerorun doctor`: would a launch on these hosts work? Every host checked, in parallel, in seconds.

Usage:

  zerorun doctor                                  # this machine alone (local runner)
  zerorun doctor -H hostfile                      # every host of the hostfile, over ssh
  zerorun doctor -H hostfile -e w3 --master-port 29600 --json
  zerorun doctor -H hostfile --config ds.json --save-dir ckpt   # + the disks the job writes

The hosts, the master and the runner are chosen exactly as the launch chooses them
(launcher/main.py); the checks are launcher/doctor/hosts.py's. Exit status 0 only when a
launch would work (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from zerorun.commands.console import console
from zerorun.commands.options import Json

if TYPE_CHECKING:  # the launcher is imported when the command runs, not when the CLI starts
    from launcher.doctor.collective import CollectiveReport
    from launcher.doctor.hosts import DoctorReport, HostReport

Hostfile = Annotated[str | None, typer.Option("--hostfile", "-H", help="DeepSpeed-style hostfile (default: this machine).")]
Include = Annotated[str | None, typer.Option("--include", "-i", help="Only these hosts/slots, e.g. 'w1@w2:0,1'.")]
Exclude = Annotated[str | None, typer.Option("--exclude", "-e", help="Drop these hosts/slots, e.g. 'w2'.")]
MasterAddr = Annotated[str | None, typer.Option("--master-addr", help="Rank 0's address (default: as the launch picks).")]
MasterPort = Annotated[str | None, typer.Option(
    "--master-port", help="Rank 0's store port, or `auto` (default: as the launch picks: 29500, or a free one here).")]
Gpus = Annotated[int | None, typer.Option("--gpus", min=1, help="Ranks per node (the launcher's --num_gpus).")]
NumNodes = Annotated[int | None, typer.Option("--nodes", min=1, help="Use the first N hosts (--num_nodes).")]
Launcher = Annotated[str | None, typer.Option("--launcher", help="local, ssh, pdsh, slurm or openmpi (default: as the launch picks).")]
SshPort = Annotated[int | None, typer.Option("--ssh-port", help="ssh port on every host.")]
SshArgs = Annotated[str | None, typer.Option("--ssh-args", help="Extra ssh arguments, one quoted string.")]
Env = Annotated[list[str] | None, typer.Option("--env", help="K=V exported to the ranks (checks *_SOCKET_IFNAME).")]
Config = Annotated[str | None, typer.Option("--config", help="The job's config: validated, its NVMe paths checked.")]
SaveDir = Annotated[str | None, typer.Option("--save-dir", help="Where the job saves checkpoints: checked on every host.")]
Collective = Annotated[bool | None, typer.Option(
    "--collective/--no-collective",
    help="Also launch a gloo all-reduce over every rank and time each node pair (default: on for several nodes).")]


def launcher_argv(hostfile: str | None, include: str | None, exclude: str | None, master_addr: str | None,
                  master_port: str | None, launcher: str | None, ssh_port: int | None, ssh_args: str | None,
                  env: list[str], config: str | None = None, gpus: int | None = None,
                  nodes: int | None = None) -> list[str]:
    """The launcher's own flags for these options, so the plan is the one a launch would make."""
    argv: list[str] = []
    for flag, value in (("--master_port", master_port), ("--num_gpus", None if gpus is None else str(gpus)),
                        ("--num_nodes", None if nodes is None else str(nodes)), ("--hostfile", hostfile), ("--include", include), ("--exclude", exclude), ("--config", config),
                        ("--master_addr", master_addr), ("--launcher", launcher),
                        ("--ssh_port", None if ssh_port is None else str(ssh_port)), ("--ssh_args", ssh_args)):
        if value is not None:
            argv += [flag, value]
    for item in env:
        argv += ["--env", item]
    return [*argv, "zerorun-doctor"]


def written_paths(config: str | None, save_dir: str | None, cwd: str, world_size: int) -> dict[str, str]:
    """``{label: absolute path}`` the job writes: the save dir, the config's NVMe swap folders
    (relative paths are the ranks': under the launch's directory)."""
    paths = {"save dir": save_dir} if save_dir else {}
    if config:
        from zerorun.config import load_config

        zero = load_config(config, world_size=world_size).zero_optimization
        for name in ("offload_optimizer", "offload_param"):
            block = getattr(zero, name)
            if block.device == "nvme" and block.nvme_path:
                paths[f"{name}.nvme_path"] = block.nvme_path
    return {label: os.path.join(cwd, p) for label, p in paths.items()}


def run_doctor(argv: list[str], collective: bool | None = False, save_dir: str | None = None) -> DoctorReport:
    """The checks of the plan ``argv`` makes; then the real collective when ``collective`` (None:
    when the plan has several nodes), only if the checks found no error."""
    import dataclasses

    from launcher.args import parse_args
    from launcher.doctor.collective import run_collective, skipped
    from launcher.doctor.hosts import check_hosts
    from launcher.main import choose_runner, make_plan, resolve_nodes, ssh_options

    ns = parse_args(argv)
    nodes, local = resolve_nodes(ns)
    kind = choose_runner(ns, nodes, local)
    plan, config = make_plan(ns, nodes, local, check_port=False)  # a taken port is a finding here
    report = check_hosts(plan, kind, ssh_options(ns), paths=written_paths(config, save_dir, plan.cwd, plan.world_size))
    if not (collective or (collective is None and len(plan.nodes) > 1)):
        return report
    hosts = [n.host for n in plan.nodes]
    done = run_collective(argv[:-1], hosts) if report.ok else skipped(hosts, "the checks above found errors")
    return dataclasses.replace(report, collective=done)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n >> 20} MiB" if n < (1 << 30) else f"{n / (1 << 30):.0f} GiB"


def _limit(value: int, unlimited: int, unit_kib: bool) -> str:
    return "unlimited" if value == unlimited else f"{value >> 10} KiB" if unit_kib else str(value)


def _disk(d: dict[str, Any]) -> str:
    if "error" in d:
        return f"{d['path']}: {d['error']}"
    return f"{_mib(d['free'])} of {_mib(d['total'])} ({d['path']}{'' if d['exists'] else ', not yet made'})"


def _rows(h: HostReport) -> list[tuple[str, str]]:
    """The facts of one host, one per row (only what its probe answered)."""
    if h.facts is None:
        return [("answer", "[red]none[/]")]
    v, lim, net = h.facts["versions"], h.facts["limits"], h.facts["network"]
    torch = v["torch"] or "none"
    if v["cuda"]:
        torch += f", CUDA {v['cuda']}" + (f", NCCL {v['nccl']}" if v["nccl"] else "")
    rt = net.get("route", {})
    route = f"{rt.get('interface')} {rt.get('source')}, MTU {rt.get('mtu')}" if "source" in rt else rt.get("error", "-")
    return [
        ("python / zerorun", f"{v['python']} / {v['zerorun']}"), ("torch", torch),
        ("driver", v["driver"] or "none"), ("gpus / slots", f"{lim['gpus']} / {h.slots}"),
        ("/dev/shm", _mib((lim.get("shm") or {}).get("total"))),
        ("ulimit -l / -n", f"{_limit(lim['memlock'], lim['unlimited'], True)} / {_limit(lim['nofile'], lim['unlimited'], False)}"),
        *((f"free: {label}", _disk(d)) for label, d in sorted((h.facts.get("disks") or {}).items())),
        ("clock offset", "-" if h.clock_offset is None else f"{h.clock_offset:+.2f} s (+-{h.seconds / 2:.2f})"),
        ("master resolves to", ", ".join(net.get("resolved", [])) or "-"),
        ("route to master", route), ("master port", net.get("connect", {}).get("result", "not tried")),
    ]


def show(report: DoctorReport, console: Console) -> None:
    """A table per host, then every finding with its fix, then the verdict line."""
    console.print(f"master {report.master_addr}:{report.master_port}, runner {report.runner}", highlight=False)
    for h in report.hosts:
        status = "[green]ok[/]" if h.ok else "[red]error[/]"
        table = Table(title=f"node {h.node_rank}: {h.host} ({status})", show_header=False, title_justify="left")
        table.add_column("check", style="bold")
        table.add_column("value")
        for key, value in _rows(h):
            table.add_row(key, value)
        console.print(table)
    for f in report.findings:
        tag = "[red]error[/]" if f.error else "[yellow]warning[/]"
        console.print(f"{tag} \\[{f.problem.value}] {f.message}\n    fix: {f.fix}", highlight=False)
    if report.interfaces:
        names = {name for _, name in report.interfaces}
        where = names.pop() if len(names) == 1 else ", ".join(f"{h}={n}" for h, n in report.interfaces)
        said = (f"a launch exports it per node as {' and '.join(report.exported)}" if report.exported
                else "the user's or the hosts' *_SOCKET_IFNAME stay as set")
        console.print(f"interface: the route to the master leaves by {where} ({said})", highlight=False)
    if report.collective is not None:
        show_collective(report.collective, console)
    console.print(("[green]" if report.ok else "[red]") + report.verdict() + "[/]", highlight=False)


def show_collective(c: CollectiveReport, console: Console) -> None:
    """The collective's line, the node-pair matrix (latency / bandwidth) and its slowest link."""
    if c.skipped:
        console.print(f"collective: not run ({c.skipped})", highlight=False)
        return
    if c.result is None:
        return  # its finding says why
    r = c.result
    nccl = f", nccl {r['nccl_seconds'] * 1e3:.1f} ms" if "nccl_seconds" in r else ""
    console.print(f"collective: all-reduce over {r['world']} ranks ok (gloo {r['gloo_seconds'] * 1e3:.1f} ms{nccl}), "
                  f"launched and done in {c.seconds:.1f} s", highlight=False)
    if not c.links:
        return
    console.print("links between nodes (latency, bandwidth):", highlight=False)
    table = Table()
    table.add_column("")
    for h in c.hosts[1:]:
        table.add_column(h)
    cells = {(x["a"], x["b"]): f"{x['latency_us']:.0f} us, {x['bytes_per_s'] / 1e6:.0f} MB/s" for x in c.links}
    for a in c.hosts[:-1]:
        table.add_row(a, *(cells.get((a, b), "") for b in c.hosts[1:]))
    console.print(table)
    slow = c.slowest
    if slow is not None:
        console.print(f"slowest link: {slow['a']} - {slow['b']} ({slow['bytes_per_s'] / 1e6:.0f} MB/s, "
                      f"{slow['latency_us']:.0f} us)", highlight=False)


def command(
    hostfile: Hostfile = None, include: Include = None, exclude: Exclude = None, master_addr: MasterAddr = None,
    master_port: MasterPort = None, launcher: Launcher = None, ssh_port: SshPort = None, ssh_args: SshArgs = None,
    env: Env = None, config: Config = None, save_dir: SaveDir = None, collective: Collective = None,
    as_json: Json = False, gpus: Gpus = None, nodes: NumNodes = None,
) -> int:
    """Check every host a launch would use: versions, GPUs, limits, clocks, the route and port to the master,
    then (several nodes, or --collective) a real all-reduce over every rank and the node-pair link matrix.

    Examples:

      zerorun doctor

      zerorun doctor -H hostfiles/two-nodes --json
    """
    report = run_doctor(launcher_argv(hostfile, include, exclude, master_addr, master_port, launcher,
                                      ssh_port, ssh_args, env or [], config, gpus, nodes), collective, save_dir)
    if as_json:
        data: dict[str, Any] = report.to_dict()
        print(json.dumps(data, indent=2))
    else:
        show(report, console())
    raise typer.Exit(0 if report.ok else 1)
