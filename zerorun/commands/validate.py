"""`zerorun validate FILE [FILE...]`: check configs before any rank starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zerorun.config import ConfigError, LoadedConfig, Problem, inspect_config
from zerorun.errors import ZerorunError

WorldSizeOption = Annotated[
    int | None,
    typer.Option(
        "--world-size",
        "-w",
        min=1,
        help="Data-parallel ranks; completes the batch triple (else derived at run time).",
    ),
]
HiddenSizeOption = Annotated[
    int | None,
    typer.Option("--hidden-size", min=1, help='Model hidden size; resolves the bucket-size "auto" values.'),
]


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


def _report_notes(problems: tuple[Problem, ...], origin: str, label: str) -> None:
    for problem in problems:
        typer.echo(f"{label}: {problem.render(origin)}", err=True)


def check_file(path: str, world_size: int | None, hidden_size: int | None) -> bool:
    """Validate one file, print its result; True when it is valid."""
    try:
        loaded = inspect_config(Path(path), world_size=world_size, hidden_size=hidden_size)
    except ConfigError as err:
        _report_notes(err.warnings, err.origin, "warning")
        count = len(err.problems)
        typer.echo(f"{err.origin}: invalid ({count} problem{'s' if count != 1 else ''})")
        for problem in err.problems:
            typer.echo(f"  {problem.render(err.origin)}")
        return False
    _report_notes(loaded.warnings, loaded.origin, "warning")
    _report_notes(loaded.notes, loaded.origin, "note")
    typer.echo(f"{loaded.origin}: ok ({summary(loaded)})")
    return True


def command(
    files: Annotated[
        list[str], typer.Argument(help="Config files (JSON or YAML, DeepSpeed keys).", show_default=False)
    ],
    world_size: WorldSizeOption = None,
    hidden_size: HiddenSizeOption = None,
) -> None:
    """Validate DeepSpeed-style config files: every problem, at once, before any rank starts.

    Unknown keys (with a did-you-mean), wrong types and ranges, deprecated names,
    cross-field conflicts (fp16 with bf16, nvme without nvme_path, offload_param
    below stage 3) and the batch triple train_batch_size = micro batch x
    gradient_accumulation_steps x world size are all checked. "auto" values that
    need the world or the model are reported as resolved at run time.

    Prints one line per valid file and every problem of an invalid one (file: key:
    message); warnings and notes go to stderr. Exit status 1 if any file is invalid.

    Examples:

      zerorun validate ds_config.json

      zerorun validate templates/*.yaml --world-size 8

      zerorun validate hf_zero3.json --world-size 16 --hidden-size 4096
    """
    results = [check_file(path, world_size, hidden_size) for path in files]
    bad = results.count(False)
    if bad:
        raise ZerorunError(
            f"{bad} of {len(results)} config file{'s' if len(results) != 1 else ''} invalid",
            hint="fix the keys listed above; `zerorun print-config FILE` shows every key with its default",
        )
    if len(results) > 1:
        typer.echo(f"all {len(results)} files valid")
