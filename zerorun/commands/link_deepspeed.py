"""`zerorun link-deepspeed`: the `deepspeed` and `ds_report` commands, run by zerorun, in this environment.

Usage:
    zerorun link-deepspeed                 # into this venv's bin (refused where DeepSpeed is installed)
    zerorun link-deepspeed --remove        # take them out again
    deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def command(
    bin_dir: Annotated[Path | None, typer.Option("--bin-dir", help="Where to write (default: this environment's bin).")] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Remove the commands zerorun wrote.")] = False,
) -> None:
    """Write `deepspeed` and `ds_report` commands that run zerorun (never over a real DeepSpeed).

    `deepspeed ARGS` then parses DeepSpeed's launcher options and runs
    `zerorun --as_deepspeed ARGS`: the scripts of DeepSpeedExamples and the Hugging Face
    docs launch unchanged.

    Examples:

      zerorun link-deepspeed

      zerorun link-deepspeed --remove
    """
    from zerorun.compat.ds_commands_link import link, unlink

    if remove:
        gone = unlink(bin_dir)
        typer.echo("\n".join(f"removed {p}" for p in gone) if gone else "nothing to remove: no command of zerorun's there")
        return
    for path in link(bin_dir):
        typer.echo(f"wrote {path}")
