"""``deepspeed.utils.torch.required_torch_version`` (zerorun.compat.torch_version) with DeepSpeed's rule."""

from __future__ import annotations

import pytest
import torch

from zerorun.compat.torch_version import is_functorch_transforming, required_torch_version


def test_bounds_read_as_deepspeeds() -> None:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    assert required_torch_version(min_version=1.4)  # a float reads as "1.4"
    assert required_torch_version(min_version=f"{major}.{minor}")
    assert not required_torch_version(min_version=f"{major}.{minor + 1}")
    assert not required_torch_version(max_version=f"{major}.{minor - 1}")
    assert required_torch_version(min_version="1.0", max_version=f"{major + 1}.0")
    with pytest.raises(AssertionError, match="min_version or max_version"):
        required_torch_version()


def test_functorch_probe() -> None:
    seen: list[bool] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append(is_functorch_transforming())
        return x.sum()

    f(torch.ones(1))
    torch.func.grad(f)(torch.ones(1))
    assert seen == [False, True]
