"""Global gradient norm and the non-finite check, across shards, in one scalar all-reduce.

A non-finite gradient anywhere makes the sum of squares inf/nan, and the all-reduce
spreads that to every rank, so all ranks agree to skip the step.
"""

from __future__ import annotations

import torch

from zerorun.engine.comm.collectives import Collectives


def global_norm_sq(owned: list[torch.Tensor], sharded: bool, coll: Collectives) -> float:
    """Sum of squares of the full (reduced) gradient, in fp32.

    ``sharded``: the owned tensors partition the gradient across ranks (sum over ranks);
    otherwise every rank holds the same full gradient (no communication needed).
    """
    # with optimizer offload the shards are in host memory: each device sums its own, in order, and the
    # sum crosses to the group's device once (a single device: the same additions as one running sum)
    device = (coll.device if sharded and not coll.simulated
              else owned[0].device if owned else torch.device("cpu"))
    partial: dict[torch.device, torch.Tensor] = {}
    for g in owned:
        sq = torch.linalg.vector_norm(g, dtype=torch.float32).square()
        partial[g.device] = partial[g.device] + sq if g.device in partial else sq
    local = torch.zeros((), dtype=torch.float32, device=device)
    for part in partial.values():
        local += part.to(device)
    if sharded:
        coll.all_reduce(local.reshape(1))
    if coll.simulated:  # the fake group's sum is undefined (and a meta tensor holds none): finite, no clipping
        return 0.0
    return float(local)


def clip_multiplier(norm_sq: float, loss_scale: float, max_norm: float) -> float:
    """The factor that unscales and clips in one multiply (DeepSpeed's ``combined_scale`` inverted).

    Matches ``torch.nn.utils.clip_grad_norm_``: coefficient ``max_norm / (norm + 1e-6)`` capped at 1.
    """
    inv = 1.0 / loss_scale
    if max_norm > 0.0:
        norm = (norm_sq ** 0.5) * inv
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            inv *= coef
    return inv
