"""`zerorun elastic --config ds.json [--world N]`: the world sizes an elastic config runs at, and their batches.

Usage:
    zerorun elastic --config ds.json              # the global batch and every valid world size
    zerorun elastic --config ds.json --world 6    # that world's micro batch and accumulation
    zerorun elastic --config ds.json --json

DeepSpeed's ``ds_elastic``, from the config's ``elasticity`` block (``zerorun.config.elastic``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from zerorun.commands.options import Json


def _rows(block: dict[str, Any], worlds: tuple[int, ...]) -> list[dict[str, int]]:
    from zerorun.config.elastic import compute

    rows = []
    for world in worlds:
        plan = compute(block, world)
        assert plan.micro_batch is not None and plan.gradient_accumulation_steps is not None
        rows.append({"world": world, "micro_batch": plan.micro_batch,
                     "gradient_accumulation_steps": plan.gradient_accumulation_steps})
    return rows


def command(
    config: Annotated[Path, typer.Option("--config", "-c", help="A DeepSpeed/zerorun config with an elasticity "
                                         "block.", show_default=False)],
    world: Annotated[int | None, typer.Option("--world", min=1, help="One world size (ranks) to plan for; "
                                              "needed by version 0.2.")] = None,
    as_json: Json = False,
) -> None:
    """Print the global batch, the valid world sizes and each one's micro batch and accumulation.

    Examples:

      zerorun elastic --config ds.json

      zerorun elastic --config ds.json --world 6
    """
    from zerorun.config.elastic import ElasticError, compute, enabled
    from zerorun.config.read import read_source
    from zerorun.errors import ZerorunError

    raw, origin = read_source(config)
    block = raw.get("elasticity")
    if not enabled(block):
        raise ZerorunError(f"{origin}: has no enabled elasticity block",
                           'add "elasticity": {"enabled": true, "max_train_batch_size": 2000, '
                           '"micro_batch_sizes": [2, 4, 6]}')
    assert isinstance(block, dict)
    try:
        plan = compute(block, world)
        rows = _rows(block, (world,) if world is not None else plan.valid_worlds)
    except ElasticError as err:
        raise ZerorunError(f"{origin}: {err.key}: {err.message}", err.hint) from None
    if as_json:
        typer.echo(json.dumps({"train_batch_size": plan.train_batch_size, "valid_worlds": list(plan.valid_worlds),
                               "plans": rows}))
        return
    typer.echo(f"train_batch_size {plan.train_batch_size}; valid world sizes: "
               f"{', '.join(map(str, plan.valid_worlds))}")
    typer.echo(f"{'world':>7} {'micro_batch':>12} {'grad_accum':>11}")
    for row in rows:
        typer.echo(f"{row['world']:>7} {row['micro_batch']:>12} {row['gradient_accumulation_steps']:>11}")
