"""``deepspeed.runtime.zero.linear`` (zerorun.compat.linear): ``LinearFunctionForZeroStage3`` and
``zero3_linear_wrap`` with DeepSpeed 0.19.8's semantics.

* the gradients equal torch's linear for a 1-D (one sample), 2-D and batched input, with and without a bias;
* ``torch.func.vmap`` and ``torch.func.grad_and_value`` take it (``setup_context``, ``generate_vmap_rule``);
* the forward's autocast state is recorded (``ctx._fwd_used_autocast``, ``ctx._dtype``) and the backward
  runs under it: an autocast region around ``backward()`` after a plain forward changes no gradient bit;
* a stage-3 weight released when backward reaches it is gathered for the backward by its own
  ``all_gather()`` and released after by its ``partition()``, as DeepSpeed's does (an engine of one rank in
  this process: the input's and the weight's gradients equal plain torch on the whole weight, and the
  weight is ``NOT_AVAILABLE`` again).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerorun.compat.linear import LinearFunctionForZeroStage3, zero3_linear_wrap


def _leaves(*ts: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.detach().clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("shape", [(8,), (3, 8), (2, 3, 8)], ids=["1d", "2d", "3d"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_gradients_equal_torchs_linear(shape: tuple[int, ...], with_bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g), torch.randn(4, 8, generator=g)
    b = torch.randn(4, generator=g) if with_bias else None
    ours, ref = _leaves(x, w, b), _leaves(x, w, b)
    y = zero3_linear_wrap(*ours)
    assert type(y.grad_fn).__name__ == "LinearFunctionForZeroStage3Backward"
    y.square().sum().backward()
    nn.functional.linear(*ref).square().sum().backward()
    torch.testing.assert_close(y, nn.functional.linear(x, w, b))
    for a, r in zip(ours, ref, strict=True):
        if a is not None:
            assert a.grad is not None and a.grad.shape == a.shape
            torch.testing.assert_close(a.grad, r.grad)


def test_functorch_transforms_take_it() -> None:
    g = torch.Generator().manual_seed(1)
    w, b, xs = torch.randn(4, 8, generator=g), torch.randn(4, generator=g), torch.randn(3, 8, generator=g)
    y = torch.func.vmap(lambda xi: LinearFunctionForZeroStage3.apply(xi, w, b).sum())(xs)
    torch.testing.assert_close(y, (xs @ w.t() + b).sum(-1))
    grads, value = torch.func.grad_and_value(lambda w_, x_: zero3_linear_wrap(x_, w_, None).square().sum(),
                                             argnums=(0, 1))(w, xs)
    torch.testing.assert_close(value, (xs @ w.t()).square().sum())
    torch.testing.assert_close(grads[0], 2 * (xs @ w.t()).t() @ xs)
    torch.testing.assert_close(grads[1], 2 * (xs @ w.t()) @ w)


def test_the_backward_runs_under_the_forwards_autocast_state() -> None:
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(5, 16, generator=g), torch.randn(7, 16, generator=g), torch.randn(7, generator=g)
    ours, ref = _leaves(x, w, b), _leaves(x, w, b)
    y = zero3_linear_wrap(*ours)
    assert y.grad_fn._fwd_used_autocast is False and y.grad_fn._dtype == torch.get_autocast_dtype("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # must not reach the backward: the forward ran without it
        y.sum().backward()
    nn.functional.linear(*ref).sum().backward()
    for a, r in zip(ours, ref, strict=True):
        assert a.grad.dtype == torch.float32
        torch.testing.assert_close(a.grad, r.grad)  # fp32 bits: a bf16 matmul would be off by ~1e-2
    amp = _leaves(x, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = zero3_linear_wrap(*amp)
    assert y.dtype == torch.bfloat16 and y.grad_fn._fwd_used_autocast is True and y.grad_fn._dtype == torch.bfloat16
    y.float().sum().backward()
    assert all(a.grad.dtype == torch.float32 for a in amp)  # accumulated in the leaves' dtype


def _released_weight(rank: int, world: int) -> dict:
    import zerorun
    from zerorun.compat.utils import safe_get_full_grad
    from zerorun.zero import GatheredParameters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    w0, b0 = (p.detach().clone() for p in model[0].parameters())
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = zerorun.initialize(model=model, config=cfg)
    lin = engine.module[0]
    xs = [torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    x = xs[rank].clone().requires_grad_()
    with GatheredParameters([lin.weight, lin.bias]):
        y = zero3_linear_wrap(x, lin.weight, lin.bias)
    released = lin.weight.ds_status.name, tuple(lin.weight.data.shape)
    calls: list[str] = []
    for name in ("all_gather", "partition"):  # DeepSpeed's methods on the parameter, watched
        method = getattr(lin.weight, name)
        lin.weight.__dict__[name] = lambda *a, _m=method, _n=name, **k: (calls.append(_n), _m(*a, **k))[1]
    y.square().sum().backward()  # the Function gathers the weight, computes, releases it
    ref_w = w0.clone().requires_grad_()
    ref_x = xs[rank].clone().requires_grad_()
    nn.functional.linear(ref_x, ref_w, b0).square().sum().backward()
    for other in (xx for r, xx in enumerate(xs) if r != rank):
        nn.functional.linear(other, ref_w, b0).square().sum().backward()
    return {"released": released, "after": lin.weight.ds_status.name, "calls": calls,
            "x": torch.allclose(x.grad, ref_x.grad, atol=1e-5),
            "w": torch.allclose(safe_get_full_grad(lin.weight), ref_w.grad / world, atol=1e-5)}


def test_a_released_stage3_weight_is_gathered_for_the_backward(world_of_one: None) -> None:
    got = _released_weight(0, 1)
    assert got == {"released": ("NOT_AVAILABLE", (0,)), "after": "NOT_AVAILABLE", "calls": ["all_gather", "partition"],
                   "x": True, "w": True}
