"""The engine's outputs divide a backward the script runs itself by the accumulation steps
(zerorun/engine/training/plain_backward.py, DeepSpeed 0.19.8's rule), without processes: which
outputs are hooked, which backward passes are divided. The engine's parity at every stage is
tests/engine/test_engine_plain_backward.py."""

from __future__ import annotations

import pytest
import torch

from zerorun.engine.errors import LossScalingRequired
from zerorun.engine.training.plain_backward import engine_backward, hook_outputs


def _leaf() -> torch.Tensor:
    return torch.tensor([1.0, 2.0], requires_grad=True)


def test_a_plain_backward_through_every_output_is_divided() -> None:
    x = _leaf()
    outputs = {"logits": x * 3, "aux": [x * 5, (x * 7, "not a tensor")], "none": None}
    hook_outputs(outputs, 4, rank=0)
    loss = outputs["logits"].sum() + outputs["aux"][0].sum() + outputs["aux"][1][0].sum()
    loss.backward()
    torch.testing.assert_close(x.grad, torch.full((2,), 15.0 / 4))


def test_a_non_scalar_backward_is_divided() -> None:
    x = _leaf()
    out = x * 2
    hook_outputs(out, 2, rank=0)
    out.backward(torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(x.grad, torch.tensor([1.0, 3.0]))


def test_engine_backward_is_left_alone_and_one_step_hooks_nothing() -> None:
    x = _leaf()
    out = x * 2
    hook_outputs(out, 4, rank=0)
    with engine_backward():
        out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2,), 2.0))
    y = x * 2
    hook_outputs(y, 1, rank=0)
    assert not y._backward_hooks  # nothing to divide or refuse at one step


def test_outputs_without_a_graph_are_not_hooked() -> None:
    x = _leaf()
    with torch.no_grad():
        out = x * 2
    hook_outputs(out, 4, rank=0)
    leaf = _leaf()
    hook_outputs(leaf, 4, rank=0)  # a leaf has no grad_fn: DeepSpeed hooks none either
    assert not out._backward_hooks and not leaf._backward_hooks


def test_torch_func_transforms_are_not_divided() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        out = x * 3
        hook_outputs(out, 4, rank=0)
        return out.sum()

    torch.testing.assert_close(torch.func.grad(f)(torch.ones(2)), torch.full((2,), 3.0))


def test_an_unscaled_plain_backward_is_refused_before_any_gradient() -> None:
    x = _leaf()
    out = x * 2
    hook_outputs(out, 1, rank=3, unscaled=lambda: True)
    with pytest.raises(LossScalingRequired, match=r"^\[rank 3\] Loss scaling is required") as err:
        out.sum().backward()
    assert isinstance(err.value, RuntimeError) and x.grad is None  # DeepSpeed's type; nothing landed
    out = x * 2
    hook_outputs(out, 2, rank=0, unscaled=lambda: False)  # engine.scale(loss) ran: divided only
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2,), 1.0))
