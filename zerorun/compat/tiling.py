"""``deepspeed.runtime.zero.tiling``: ``TiledLinear``, a linear layer built as a grid of smaller ones.

Under ZeRO stage 3 each tile is its own module, so only the tile running is ever gathered:
a layer too large to gather whole trains tile by tile. The layer computes what one
``nn.Linear`` of the same shape computes: the input's last dimension is cut into
``in_splits`` chunks and the output's into ``out_splits``; tile ``[o][i]`` maps input chunk
``i`` to output chunk ``o``, the tiles of one output chunk are summed, and the output chunks
are concatenated. Only the last tile of each row has a bias. Chunk boundaries are DeepSpeed's
(``in_parts``/``out_parts``: the first ``n % splits`` chunks are one element longer).

``TiledLinearReturnBias`` tiles a layer that returns ``(output, bias)`` (Megatron-LM's
delayed bias): outputs are summed and concatenated, and the biases concatenated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def uniform_bounds(items: int, parts: int) -> list[int]:
    """``parts + 1`` boundaries cutting ``items`` into ``parts`` near-equal runs (longer runs first);
    with fewer items than parts, the last runs are empty."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


class TiledLinear(nn.Module):
    """A drop-in for ``nn.Linear(in_features, out_features, bias)`` made of ``out_splits x in_splits`` tiles.

    ``input_is_already_split``: ``forward`` takes the ``in_splits`` input chunks as a list;
    ``combine_out_splits=False``: it returns the output chunks as a list; ``linear_cls`` (with
    ``**kwargs``) builds each tile; ``init_linear``: copy that layer's weights into the tiles.
    Raises ``RuntimeError`` when a split count is under 1 or over its dimension, as DeepSpeed does.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, in_splits: int = 1,
                 out_splits: int = 1, input_is_already_split: bool = False, combine_out_splits: bool = True,
                 linear_cls: type[nn.Module] = nn.Linear, init_linear: nn.Module | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        if not 1 <= in_splits <= in_features:
            raise RuntimeError(f"in splits must be in range [1, in_features]: got {in_splits} for {in_features}")
        if not 1 <= out_splits <= out_features:
            raise RuntimeError(f"out splits must be in range [1, out_features]: got {out_splits} for {out_features}")
        self.in_features, self.out_features, self.use_bias = in_features, out_features, bias
        self.in_splits, self.out_splits = in_splits, out_splits
        self.input_is_already_split, self.combine_out_splits = input_is_already_split, combine_out_splits
        self.in_parts = uniform_bounds(in_features, in_splits)
        self.out_parts = uniform_bounds(out_features, out_splits)
        self.linears = nn.ModuleList()
        for o in range(out_splits):
            rows = self.out_parts[o + 1] - self.out_parts[o]
            self.linears.append(nn.ModuleList(
                linear_cls(self.in_parts[i + 1] - self.in_parts[i], rows, bias=bias and i == in_splits - 1, **kwargs)
                for i in range(in_splits)))
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_: Any) -> Any:
        if self.in_splits == 1:
            chunks = [input_]
        elif self.input_is_already_split:
            chunks = list(input_)
            if len(chunks) != self.in_splits:
                raise ValueError(f"expected {self.in_splits} input chunks, got {len(chunks)}")
        else:
            bounds = uniform_bounds(input_.shape[-1], self.in_splits)
            chunks = list(torch.split(input_, [bounds[p + 1] - bounds[p] for p in range(self.in_splits)], dim=-1))
        outputs = []
        for row in self.linears:
            acc = None
            for i, tile in enumerate(row):
                acc = self._accumulate(acc, tile(chunks[i]))
            outputs.append(acc)
        return self._combine(outputs) if self.combine_out_splits else outputs

    def _accumulate(self, acc: Any, new: Any) -> Any:
        """Sum one tile's output into its row's (the first is cloned: a view must not be added to in place)."""
        return new.clone() if acc is None else acc + new

    def _combine(self, outputs: list[Any]) -> Any:
        return torch.cat(outputs, dim=-1)

    @torch.no_grad()
    def copy_params_from(self, other: nn.Module) -> None:
        """Copy ``other``'s weight (and bias) into the tiles; under stage 3, rank 0's values reach every rank."""
        from zerorun.zero import GatheredParameters

        weight, other_bias = other.weight, getattr(other, "bias", None)
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"init_linear's weight is {tuple(weight.shape)}, expected "
                             f"{(self.out_features, self.in_features)}")
        if self.use_bias != (other_bias is not None):
            raise ValueError(f"init_linear {'has no' if self.use_bias else 'has a'} bias, unlike this layer")
        for o, row in enumerate(self.linears):
            r0, r1 = self.out_parts[o], self.out_parts[o + 1]
            for i, tile in enumerate(row):
                c0, c1 = self.in_parts[i], self.in_parts[i + 1]
                with GatheredParameters(tile.weight, modifier_rank=0):
                    tile.weight.copy_(weight[r0:r1, c0:c1])
                if tile.bias is not None:
                    with GatheredParameters(tile.bias, modifier_rank=0):
                        tile.bias.copy_(other_bias[r0:r1])


class TiledLinearReturnBias(TiledLinear):
    """``TiledLinear`` over tiles that return ``(output, bias)``: returns ``(output, bias or None)``."""

    def _accumulate(self, acc: Any, new: Any) -> Any:
        out, bias = new
        prev_out, prev_bias = acc if acc is not None else (None, None)
        return super()._accumulate(prev_out, out), bias if bias is not None else prev_bias

    def _combine(self, outputs: list[Any]) -> Any:
        biases = [b for _, b in outputs if b is not None]
        return super()._combine([o for o, _ in outputs]), super()._combine(biases) if biases else None


__all__ = ["TiledLinear", "TiledLinearReturnBias", "uniform_bounds"]
