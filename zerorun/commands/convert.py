"""`zerorun convert CHECKPOINT_DIR OUT`: one full state dict from a sharded checkpoint.

Usage:
    zerorun convert checkpoints/ model.pt                      # the tag named by checkpoints/latest
    zerorun convert checkpoints/global_step100 model.safetensors --dtype bf16
    zerorun convert checkpoints/ model.pt --tag global_step50
    zerorun convert downloaded/ model.pt --trust                # files that pickle code: only ones you vouch for

The result loads with ``model.load_state_dict(torch.load("model.pt"))`` (or
``safetensors.torch.load_file``) without zerorun and without a process group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DTYPES = ("fp32", "bf16", "fp16")


def command(
    checkpoint_dir: Annotated[Path, typer.Argument(help="A save_dir (uses its 'latest' tag) or one tag directory.",
                                                   metavar="CHECKPOINT_DIR")],
    out: Annotated[Path, typer.Argument(help="Output file: .safetensors (needs safetensors) or .pt.", metavar="OUT")],
    tag: Annotated[str | None, typer.Option("--tag", "-t", help="Tag to convert (default: latest).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="fp32 (default), bf16 or fp16.")] = "fp32",
    trust: Annotated[bool, typer.Option("--trust", help="Load files that pickle code: only checkpoints you vouch "
                                        "for (by default every file loads as data only).")] = False,
) -> None:
    """Write one consolidated state dict (fp32 by default) from a zerorun checkpoint.

    The result loads with model.load_state_dict(torch.load("model.pt")) without
    zerorun and without a process group.

    Examples:

      zerorun convert checkpoints/ model.pt

      zerorun convert checkpoints/global_step100 model.safetensors --dtype bf16
    """
    from zerorun.engine.checkpoint import consolidate, write_state_dict
    from zerorun.engine.checkpoint.consolidate import DTYPES as TORCH_DTYPES
    from zerorun.engine.checkpoint.errors import CheckpointError

    if dtype not in TORCH_DTYPES:
        raise CheckpointError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}", "use --dtype fp32 or --dtype bf16")
    state = consolidate(checkpoint_dir, tag, TORCH_DTYPES[dtype], trust)
    path = write_state_dict(state, out)
    count = len({id(t) for t in state.values()})
    numel = sum(t.numel() for t in {id(t): t for t in state.values()}.values())
    typer.echo(f"wrote {path} ({len(state)} entries, {count} tensors, {numel:,} elements, {dtype})")
