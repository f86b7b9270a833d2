"""`zerorun validate FILE [FILE...]`: check configs before any rank starts."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from zerorun.commands.options import Gpus, HiddenSize, Json, Nodes, world_size
from zerorun.commands.signatures import builder_problems, raw_builder_problems
from zerorun.config import ConfigError, LoadedConfig, inspect_config
from zerorun.config.read import read_source
from zerorun.errors import ZerorunError


def summary(loaded: LoadedConfig) -> str:
    """One line: the stage, precision, optimizer, offload and batch of a valid config."""
    cfg = loaded.config
    zero = cfg.zero_optimization
    precision = "fp16" if cfg.fp16.enabled else "bf16" if cfg.bf16.enabled else "fp32"
    optimizer = cfg.optimizer.type if cfg.optimizer else "client optimizer"
    offload = [
        f"{name} -> {block.device}"
        for name, block in (("optimizer", zero.offload_optimizer), ("params", zero.offload_param))
        if block.device != "none"
    ]
    mbs, gas = cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps
    if cfg.train_batch_size is not None and loaded.world_size is not None:
        batch = f"batch {cfg.train_batch_size} = {mbs} x {gas} x {loaded.world_size} ranks"
    else:
        shown = lambda v: "(derived)" if v is None else str(v)  # noqa: E731
        batch = f"micro batch {shown(mbs)} x accumulation {shown(gas)} x world size (at run time)"
    parts = [f"ZeRO stage {zero.stage}", precision, optimizer, *(f"offload {o}" for o in offload), batch]
    return ", ".join(parts)


def inspect_file(path: str, world: int | None, hidden_size: int | None) -> dict[str, Any]:
    """One file's result as data: ``ok``, its summary or problems, warnings and notes.

    Beyond the schema, the optimizer and scheduler params are checked against the
    signatures ``initialize`` calls, so "ok" means the engine accepts the config.
    """
    try:
        loaded = inspect_config(Path(path), world_size=world, hidden_size=hidden_size)
    except ConfigError as err:
        found = list(err.problems)
        with contextlib.suppress(ConfigError, OSError):  # unreadable: the schema's problems say so
            found += [p for p in raw_builder_problems(read_source(Path(path))[0]) if p not in found]
        return {"file": err.origin, "ok": False, "problems": [p.render(err.origin) for p in found],
                "warnings": [p.render(err.origin) for p in err.warnings], "notes": []}
    problems = builder_problems(loaded.config)
    result: dict[str, Any] = {
        "file": loaded.origin, "ok": not problems, "problems": [p.render(loaded.origin) for p in problems],
        "warnings": [p.render(loaded.origin) for p in loaded.warnings],
        "notes": [p.render(loaded.origin) for p in loaded.notes],
    }
    if not problems:
        result["summary"] = summary(loaded)
    return result


def _show(result: dict[str, Any]) -> None:
    for text in result["warnings"]:
        typer.echo(f"warning: {text}", err=True)
    for text in result["notes"]:
        typer.echo(f"note: {text}", err=True)
    if result["ok"]:
        typer.echo(f"{result['file']}: ok ({result['summary']})")
        return
    count = len(result["problems"])
    typer.echo(f"{result['file']}: invalid ({count} problem{'s' if count != 1 else ''})")
    for text in result["problems"]:
        typer.echo(f"  {text}")


def command(
    files: Annotated[
        list[str], typer.Argument(help="Config files (JSON or YAML, DeepSpeed keys).", show_default=False,
                                  metavar="FILE...")
    ],
    gpus: Gpus = None,
    nodes: Nodes = 1,
    hidden_size: HiddenSize = None,
    as_json: Json = False,
) -> None:
    """Validate DeepSpeed-style config files: every problem, at once, before any rank starts.

    Unknown keys (with a did-you-mean), wrong types and ranges, deprecated names,
    cross-field conflicts (fp16 with bf16, nvme without nvme_path, offload_param
    below stage 3), the batch triple train_batch_size = micro batch x
    gradient_accumulation_steps x world size, and the optimizer and scheduler
    params against the signatures the engine calls. "auto" values that need the
    world or the model are reported as resolved at run time.

    Prints one line per valid file and every problem of an invalid one (file: key:
    message); warnings and notes go to stderr. Exit status 1 if any file is invalid.

    Examples:

      zerorun validate ds_config.json

      zerorun validate templates/*.yaml --world-size 8

      zerorun validate hf_zero3.json --num-gpus 8 --nodes 2 --hidden-size 4096 --json
    """
    results = [inspect_file(path, world_size(gpus, nodes), hidden_size) for path in files]
    bad = sum(not r["ok"] for r in results)
    if as_json:
        typer.echo(json.dumps({"ok": not bad, "files": results}, indent=2))
        if bad:
            raise typer.Exit(1)
        return
    for result in results:
        _show(result)
    if bad:
        raise ZerorunError(
            f"{bad} of {len(results)} config file{'s' if len(results) != 1 else ''} invalid",
            hint="fix the keys listed above; `zerorun print-config FILE` shows every key with its default",
        )
    if len(results) > 1:
        typer.echo(f"all {len(results)} files valid")
