"""The ``--dry-run`` output: the rank table, the master and why, the exported variable
names (values redacted) and the exact per-node commands; or the same as JSON."""

from __future__ import annotations

import json
import shlex
from typing import Any

from launcher.plan.launch_plan import LaunchPlan, rank_argv, slot_devices
from launcher.plan.runners import NodeCommand, RunnerKind

_SHOWN_ENV_PREFIX = "PDSH_"  # pdsh's own settings carry no secrets; exported values never appear


def command_line(cmd: NodeCommand) -> str:
    shown = [f"{k}={shlex.quote(v)}" for k, v in cmd.env if k.startswith(_SHOWN_ENV_PREFIX)]
    return " ".join([*shown, shlex.join(cmd.argv)])


def _ranks_text(values: tuple[int, ...]) -> str:
    if values and list(values) == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)


def _devices_note(plan: LaunchPlan) -> str:
    if plan.visible_devices:
        return (f"inherited CUDA_VISIBLE_DEVICES={','.join(plan.visible_devices)}: the node's slots are these GPUs, "
                "slot i is the i-th id")
    return "CUDA_VISIBLE_DEVICES = the node's slots on nodes with GPUs"


def plan_text(plan: LaunchPlan, commands: list[NodeCommand], kind: RunnerKind, config: str | None) -> str:
    rows = [("host", "node", "global ranks", "local ranks", "devices (slots)")]
    for n in plan.nodes:
        rows.append((n.host, str(n.node_rank), _ranks_text(n.ranks), _ranks_text(tuple(range(len(n.ranks)))),
                     ",".join(slot_devices(plan, n))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    env_names = sorted(k for k, _ in plan.env)
    lines = [
        f"zerorun dry run: {plan.world_size} rank(s) on {len(plan.nodes)} node(s), launcher {kind.value}, job {plan.job_id}",
        "",
        *table,
        "",
        f"master    {plan.master_addr}:{plan.master_port}  ({plan.master_reason})",
        f"devices   {plan.options.devices.value} ({_devices_note(plan)})",
        f"config    {config or '(none)'}",
        f"exported  {', '.join(f'{k}=<redacted>' for k in env_names) if env_names else '(none)'}",
        "rank env  RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK GROUP_RANK CROSS_RANK MASTER_ADDR MASTER_PORT",
        f"rank cmd  {shlex.join(rank_argv(plan, 'N'))}",
        "",
        "commands (the plan reaches each agent on its stdin, or in a 0600 file for pdsh):",
    ]
    for cmd in commands:
        label = "all nodes" if cmd.node_rank is None else f"node {cmd.node_rank}"
        lines.append(f"  [{label}] {command_line(cmd)}")
    return "\n".join(lines)


def plan_json(plan: LaunchPlan, commands: list[NodeCommand], kind: RunnerKind) -> dict[str, Any]:
    return {
        "world_size": plan.world_size,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "master_reason": plan.master_reason,
        "launcher": kind.value,
        "nodes": [
            {"host": n.host, "node_rank": n.node_rank, "slots": list(n.slots), "devices": list(slot_devices(plan, n)),
             "ranks": list(n.ranks)} for n in plan.nodes
        ],
        "exported_env": sorted(k for k, _ in plan.env),
        "commands": [list(c.argv) for c in commands],
    }


def dump_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)
