"""``deepspeed.runtime.zero.tiling.TiledLinear`` (zerorun.compat.tiling): the same function as one ``nn.Linear``.

Checked against the layer it copies: the tiles' shapes and values, the outputs and the gradients
(uneven splits too), the returned-bias variant, and DeepSpeed's ``RuntimeError`` for bad split counts.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from zerorun.compat.tiling import TiledLinear, TiledLinearReturnBias, uniform_bounds


def test_bounds_put_the_longer_runs_first() -> None:
    assert uniform_bounds(10, 3) == [0, 4, 7, 10]
    assert uniform_bounds(2, 4) == [0, 1, 2, 2, 2]


@pytest.mark.parametrize(("in_f", "out_f", "splits", "bias"), [(32, 40, 1, True), (23, 29, 2, False),
                                                                (29, 23, 5, True)])
def test_tiles_compute_the_copied_linear(in_f: int, out_f: int, splits: int, bias: bool) -> None:
    torch.manual_seed(0)
    base = nn.Linear(in_f, out_f, bias=bias)
    tiled = TiledLinear(in_f, out_f, bias=bias, in_splits=splits, out_splits=splits, init_linear=copy.deepcopy(base))
    tile = tiled.linears[splits - 1][splits - 1]
    r0, c0 = tiled.out_parts[splits - 1], tiled.in_parts[splits - 1]
    assert torch.equal(tile.weight, base.weight[r0:, c0:])
    assert all(t.bias is None for row in tiled.linears for t in row[:-1])
    x = torch.randn(3, in_f)
    torch.testing.assert_close(tiled(x), base(x))
    tiled(x).square().sum().backward()
    base(x).square().sum().backward()
    torch.testing.assert_close(tile.weight.grad, base.weight.grad[r0:, c0:])


class _ReturnsBias(nn.Linear):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return nn.functional.linear(x, self.weight), self.bias


def test_return_bias_variant_concatenates_the_biases() -> None:
    base = _ReturnsBias(8, 6)
    tiled = TiledLinearReturnBias(8, 6, linear_cls=_ReturnsBias, in_splits=2, out_splits=3,
                                  init_linear=copy.deepcopy(base))
    x = torch.randn(2, 8)
    out, bias = tiled(x)
    torch.testing.assert_close(out, base(x)[0])
    torch.testing.assert_close(bias, base.bias)


@pytest.mark.parametrize("splits", [0, 33])
def test_bad_split_counts_raise_runtime_error(splits: int) -> None:
    with pytest.raises(RuntimeError, match="splits must be in range"):
        TiledLinear(32, 32, in_splits=splits, out_splits=splits)
