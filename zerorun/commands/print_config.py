"""`zerorun print-config FILE`: the fully resolved config, every default filled in."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from zerorun.commands.options import Gpus, HiddenSize, Json, Nodes, world_size
from zerorun.config import inspect_config
from zerorun.config.load import LoadedConfig
from zerorun.config.render import rows, to_json, to_yaml
from zerorun.config.templates import template_names, template_path
from zerorun.errors import ZerorunError
from zerorun.estimate.model_states import Dtype, Masters, Offload, Optimizer
from zerorun.estimate.settings import Settings


class Format(str, Enum):
    """Output formats of print-config."""

    table = "table"
    json = "json"
    yaml = "yaml"


_SOURCE_STYLE = {
    "file": "green",
    "default": "dim",
    "auto": "magenta",
    "derived": "cyan",
    "deprecated alias": "yellow",
}


def _table(loaded: LoadedConfig, changed_only: bool, docs: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{loaded.origin} (resolved)", title_justify="left", show_lines=False)
    columns = [("key", "bold"), ("value", None), ("source", None)] + (
        [("description", "dim")] if docs else []
    )
    for name, style in columns:
        table.add_column(name, style=style, overflow="fold", no_wrap=name == "key")
    for row in rows(loaded):
        if changed_only and row.source == "default":
            continue
        style = _SOURCE_STYLE.get(row.source.split(" (")[0], "")
        source = f"[{style}]{row.source}[/]" if style else row.source
        table.add_row(row.key, row.value, source, *([row.description] if docs else []))
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 200  # piped or captured: do not squeeze the table into 80 columns
    console.print(table)


def per_param_lines(loaded: LoadedConfig) -> list[str]:
    """The config's stage: model-state bytes per parameter of each master mode, the config's marked."""
    from zerorun.estimate.from_config import dtype_of, masters_of, optimizer_of
    from zerorun.estimate.model_states import Optimizer
    from zerorun.estimate.per_param import modes_for, per_param, stages_for

    cfg = loaded.config
    stage, dtype, chosen = cfg.zero_optimization.stage, dtype_of(cfg), masters_of(cfg)
    optimizer = optimizer_of(cfg) or Optimizer.ADAM
    lines = []
    for masters in modes_for(dtype):
        if stage in stages_for(masters):
            mark = "  <- this config" if masters is chosen else ""
            lines.append(f"  {masters.value:<16} {per_param(stage, masters, dtype, optimizer).formula()}{mark}")
    head = (f"model states per rank at stage {stage} ({dtype.value}, {optimizer.value}; Ψ parameters, N ranks; "
            "`zerorun estimate` for every stage):")
    return [head, *lines]


def _write(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output}", err=True)


def _print_template(template: str | None, file: Path | None, output: Path | None) -> None:
    if file is not None:
        raise ZerorunError(
            "give a FILE or --template, not both", hint="zerorun print-config --template zero3"
        )
    if template is None:
        raise ZerorunError(
            "no config file given", hint="zerorun print-config ds_config.json (or --template zero2)"
        )
    _write(template_path(template).read_text(encoding="utf-8"), output)


def _print_settings(settings: Settings, file: Path | None, template: str | None, fmt: Format,
                    output: Path | None) -> None:
    """``file`` (or ``template``, or the estimate's defaults) with ``settings`` written in, as YAML or JSON."""
    import json

    import yaml

    from zerorun.config import load_config
    from zerorun.config.read import read_source
    from zerorun.estimate.settings import base_config

    if file is not None and template is not None:
        raise ZerorunError("give a FILE or --template, not both", hint="zerorun print-config --template zero3 --stage 2")
    source = file if file is not None else template_path(template) if template is not None else None
    base = dict(read_source(source)[0]) if source is not None else base_config()
    cfg = settings.apply(base)
    load_config(cfg, world_size=1)  # the settings' config must load: its errors name the key, before it is written
    if fmt is Format.json:
        text = json.dumps(cfg, indent=2) + "\n"
    else:
        text = f"# {settings.command(str(file) if file else None, str(output or '-'))}\n" \
            + yaml.safe_dump(cfg, sort_keys=False)
    _write(text, output)


def command(
    file: Annotated[
        Path | None, typer.Argument(help="Config file (JSON or YAML).", show_default=False, metavar="FILE")
    ] = None,
    gpus: Gpus = None,
    nodes: Nodes = 1,
    hidden_size: HiddenSize = None,
    fmt: Annotated[
        Format,
        typer.Option("--format", "-f", help="table: values with their source; json/yaml: machine-readable "
                     "(--json is --format json)."),
    ] = Format.table,
    changed: Annotated[
        bool, typer.Option("--changed", help="Table: hide the keys left at their defaults.")
    ] = False,
    docs: Annotated[
        bool, typer.Option("--docs", help="Table: add a column with what each key means.")
    ] = False,
    template: Annotated[
        str | None,
        typer.Option(
            "--template", "-t", help=f"Print a ready template instead: {', '.join(template_names())}."
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
    as_json: Json = False,
    stage: Annotated[int | None, typer.Option("--stage", min=0, max=3, help="The ZeRO stage.",
                                              show_default=False)] = None,
    offload_optimizer: Annotated[Offload | None, typer.Option(
        "--offload-optimizer", help="Where the optimizer lives (offload_optimizer; none: no block).",
        show_default=False)] = None,
    offload_param: Annotated[Offload | None, typer.Option(
        "--offload-param", help="Where the parameters rest (offload_param; none: no block).", show_default=False)] = None,
    offload_ratio: Annotated[float | None, typer.Option(
        "--offload-ratio", min=0.0, max=1.0, help="Twin-Flow: the fraction of the optimizer offloaded.", show_default=False)] = None,
    dtype: Annotated[Dtype | None, typer.Option("--dtype", help="The training dtype (the bf16 or fp16 block).",
                                                show_default=False)] = None,
    optimizer: Annotated[Optimizer | None, typer.Option("--optimizer", help="The optimizer type.",
                                                        show_default=False)] = None,
    masters: Annotated[Masters | None, typer.Option(
        "--masters", help="fp32 masters, or bf16 ones (bf16 gradients and moments too), plain, -kahan or -stochastic.",
        show_default=False)] = None,
    micro_batch: Annotated[int | None, typer.Option(
        "--micro-batch", min=1, help="The micro batch per GPU.", show_default=False)] = None,
    nvme_path: Annotated[str | None, typer.Option(
        "--nvme-path", help="The NVMe folder of the offload blocks.", show_default=False)] = None,
) -> None:
    """Print the fully resolved config: every default filled in, "auto" resolved.

    The table shows each key's value and where it came from (file, default, auto,
    derived, deprecated alias); --docs adds what each key means.

    JSON and YAML are the same config as data: they validate and load to the same
    values. --template NAME prints one of the ready, commented templates.

    Examples:

      zerorun print-config ds_config.json --world-size 8

      zerorun print-config hf_zero3.json -w 16 --hidden-size 4096 --changed

      zerorun print-config templates/zero2.yaml --docs

      zerorun print-config ds_config.json --json > resolved.json

      zerorun print-config --template zero3 -o ds.yaml

      zerorun print-config --stage 3 --offload-optimizer cpu --offload-param cpu -o ds.yaml

    The settings flags (--stage, --offload-optimizer, --offload-param, --masters,
    --micro-batch, ...) write a config instead: FILE, --template or the estimate's
    defaults with those keys set; `zerorun estimate` names the command for its
    recommended row.
    """
    if as_json:
        fmt = Format.json
    settings = Settings(stage, offload_optimizer, offload_param, offload_ratio, dtype, optimizer, masters,
                        micro_batch, nvme_path)
    if settings.given():
        _print_settings(settings, file, template, fmt, output)
        return
    if template is not None or file is None:
        _print_template(template, file, output)
        return
    loaded = inspect_config(file, world_size=world_size(gpus, nodes), hidden_size=hidden_size)
    for problem in (*loaded.warnings, *loaded.notes):
        label = "warning" if problem in loaded.warnings else "note"
        typer.echo(f"{label}: {problem.render(loaded.origin)}", err=True)
    if fmt is Format.table and output is None:
        _table(loaded, changed, docs)
        typer.echo("\n".join(per_param_lines(loaded)))
    else:
        _write(
            to_json(loaded)
            if fmt is Format.json
            else to_yaml(loaded)
            if fmt is Format.yaml
            else to_json(loaded),
            output,
        )
