"""The options every tool shares, defined once so that they are spelt and mean the same.

``--gpus``, ``--num-gpus`` (= ``--num_gpus``, the launcher's name) and ``--world-size``
are one option: ranks per node, times ``--nodes`` for the world size. ``--json`` makes
a command's result (and its errors) one JSON document on stdout.
"""

from __future__ import annotations

from typing import Annotated

import typer

Gpus = Annotated[
    int | None,
    typer.Option("--gpus", "--gpus-per-node", "-w", min=1, show_default=False,
                 help="Ranks (GPUs) per node, also spelt --gpus-per-node, --num-gpus or --world-size; the world is this x --nodes."),
]
Nodes = Annotated[int, typer.Option("--nodes", min=1, help="Number of nodes (also spelt --num-nodes).")]
ALIASES = {"--num-gpus": "--gpus", "--world-size": "--gpus", "--num-nodes": "--nodes"}
"""Other names of the shared options, as the launcher and DeepSpeed spell them."""
HiddenSize = Annotated[
    int | None,
    typer.Option("--hidden-size", min=1, help='Model hidden size; resolves the bucket-size "auto" values.'),
]
Json = Annotated[bool, typer.Option("--json", help="Print the result (or the error) as JSON on stdout.")]


def world_size(gpus: int | None, nodes: int) -> int | None:
    """``gpus x nodes``, or None when no rank count was given (then it is known at run time)."""
    return None if gpus is None else gpus * nodes
