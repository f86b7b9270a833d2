"""`zerorun convert CHECKPOINT_DIR OUT`: a sharded checkpoint in the format another tool reads.

Usage:
    zerorun convert checkpoints/ model.pt                      # the tag named by checkpoints/latest
    zerorun convert checkpoints/global_step100 model.safetensors --dtype bf16
    zerorun convert checkpoints/ model.pt --tag global_step50
    zerorun convert checkpoints/ hf_out/ --to hf --max_shard_size 5GB --dtype bf16 --config config.json
    zerorun convert checkpoints/ dcp_out/ --to dcp              # torch.distributed.checkpoint (FSDP2, torchtitan)
    zerorun convert downloaded/ model.pt --trust                # files that pickle code: only ones you vouch for

One file loads with ``model.load_state_dict(torch.load("model.pt"))`` (or
``safetensors.torch.load_file``) without zerorun and without a process group; ``--to hf``
writes ``model-0000k-of-0000n.safetensors`` and ``model.safetensors.index.json``
(``from_pretrained`` reads them beside ``config.json``), streamed tensor by tensor so memory
stays near one shard; ``--to dcp`` writes a directory ``torch.distributed.checkpoint.load`` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DTYPES = ("fp32", "bf16", "fp16")


def command(
    checkpoint_dir: Annotated[Path, typer.Argument(help="A save_dir (uses its 'latest' tag) or one tag directory.",
                                                   metavar="CHECKPOINT_DIR")],
    out: Annotated[Path, typer.Argument(help="Output: a .pt or .safetensors file, or a directory for --to hf/dcp.",
                                        metavar="OUT")],
    tag: Annotated[str | None, typer.Option("--tag", "-t", help="Tag to convert (default: latest).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="fp32 (default), bf16 or fp16.")] = "fp32",
    to: Annotated[str | None, typer.Option("--to", help="pt, safetensors, hf (sharded safetensors + index) or dcp "
                                           "(default: told by OUT's extension).")] = None,
    max_shard_size: Annotated[str, typer.Option("--max_shard_size", "--max-shard-size",
                                                help="--to hf: largest shard, e.g. 5GB, 500MB.")] = "5GB",
    config: Annotated[Path | None, typer.Option("--config", help="--to hf: a config.json to copy beside the "
                                                "shards (from_pretrained-ready).")] = None,
    trust: Annotated[bool, typer.Option("--trust", help="Load files that pickle code: only checkpoints you vouch "
                                        "for (by default every file loads as data only).")] = False,
) -> None:
    """Write a zerorun (or DeepSpeed) checkpoint as one state dict, Hugging Face shards or a DCP directory.

    The single file loads with model.load_state_dict(torch.load("model.pt")) without
    zerorun and without a process group.

    Examples:

      zerorun convert checkpoints/ model.pt

      zerorun convert checkpoints/global_step100 model.safetensors --dtype bf16

      zerorun convert checkpoints/ hf_out/ --to hf --max_shard_size 5GB --config config.json

      zerorun convert checkpoints/ dcp_out/ --to dcp
    """
    from zerorun.engine.checkpoint.consolidate import DTYPES as TORCH_DTYPES
    from zerorun.engine.checkpoint.convert_to import convert_to
    from zerorun.engine.checkpoint.errors import CheckpointError

    if dtype not in TORCH_DTYPES:
        raise CheckpointError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}", "use --dtype fp32 or --dtype bf16")
    written = convert_to(checkpoint_dir, out, to, tag, dtype, trust, max_shard_size, config)
    if len(written) == 1:
        typer.echo(f"wrote {written[0]} ({dtype})")
    else:
        typer.echo(f"wrote {len(written)} files into {written[0].parent} ({dtype})")
