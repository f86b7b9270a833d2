"""A Linear's weight gradient computed into its staging slot at stages 2 and 3 (zerorun.engine.mechanism.grad_landing).

* The landing Linear's output and its input's, weight's and bias's gradients equal ``F.linear``'s
  under autograd bit for bit (2-D to 4-D inputs, with and without bias, fp32 and bf16); the
  weight's gradient is the claimed slot itself; a weight used twice in one pass gets the slot
  once and its two gradients summed, as autograd sums them.
* Installed on ``nn.Linear`` exactly, for the given weights only; a copy or a pickle of a landed
  model has torch's forward; removing it restores torch's forward.
* In the engine (two gloo ranks, stages 2 and 3, a model that calls one Linear twice): gradients
  land (counted where the sync finds them in place) and the parameters after three steps are bit
  for bit those of the same run with ``ZERORUN_LAND_GRADS=0``.
"""

from __future__ import annotations

import copy
import io
import os
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.dist_harness import run_distributed
from zerorun.engine.mechanism import grad_landing
from zerorun.engine.mechanism.grad_landing import _LandingForward, _LandingLinear


class _Slots:
    """A site that hands out one fresh slot per parameter per pass, as the sync does."""

    def __init__(self) -> None:
        self.buffer = torch.full((1 << 12,), float("nan"))  # the sync's staging buffer, here
        self.slots: dict[int, int] = {}  # parameter id -> the data pointer of its slot

    def claim(self, param: torch.Tensor, beside: torch.Tensor | None = None) -> torch.Tensor | None:
        if id(param) in self.slots:
            return None
        slot = self.buffer.to(param.dtype) if param.dtype != self.buffer.dtype else self.buffer
        view = slot.narrow(0, 0, param.numel()).view(param.shape)  # no reference kept: autograd takes it as is
        self.slots[id(param)] = view.data_ptr()
        return view


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 48), (2, 5, 48), (2, 3, 4, 48), (3, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_landing_linear_computes_what_f_linear_does_bit_for_bit(shape: tuple[int, ...], bias: bool,
                                                                    dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(shape) * 10 + shape[-1])
    x = torch.randn(*shape, generator=g).to(dtype).requires_grad_()
    w = torch.randn(33, shape[-1], generator=g).to(dtype).requires_grad_()
    b = torch.randn(33, generator=g).to(dtype).requires_grad_() if bias else None
    inputs = [x, w] + ([b] if bias else [])
    y = F.linear(x, w, b)
    go = torch.randn(y.shape, generator=g).to(dtype)
    want = torch.autograd.grad(y, inputs, go)
    site = _Slots()
    y2 = _LandingLinear.apply(b, x, w, weakref.ref(site))
    assert torch.equal(y, y2)
    w.grad = None
    y2.backward(go)
    got = [x.grad, w.grad] + ([b.grad] if bias else [])
    for a, c in zip(want, got, strict=True):
        assert torch.equal(a, c)
    assert w.grad.data_ptr() == site.slots[id(w)]  # computed in the slot, not copied there


def test_a_weight_used_twice_lands_once_and_sums_as_autograd_does() -> None:
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, generator=g)
    ref = copy.deepcopy(lin)
    ref(ref(x)).square().sum().backward()
    site = _Slots()
    lin.forward = _LandingForward(lin, weakref.ref(site))
    lin(lin(x)).square().sum().backward()
    assert torch.equal(lin.weight.grad, ref.weight.grad) and torch.equal(lin.bias.grad, ref.bias.grad)
    assert id(lin.weight) in site.slots  # the first gradient had the slot, the second was its own tensor


class Wide(nn.Linear):
    """A subclass: it may have a forward of its own."""


def test_installed_on_plain_linears_of_the_given_weights_and_undone_by_copies_and_removal() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Wide(4, 4), nn.Linear(4, 4))
    site = _Slots()
    landed = grad_landing.install(model, site, {id(model[0].weight), id(model[1].weight)})
    assert isinstance(model[0].__dict__.get("forward"), _LandingForward)
    assert "forward" not in model[1].__dict__  # a subclass may have its own forward: left alone
    assert "forward" not in model[2].__dict__  # a weight the engine does not reduce
    for clone in (copy.deepcopy(model), _pickled(model)):
        assert not isinstance(clone[0].__dict__.get("forward"), _LandingForward)
        x = torch.randn(2, 4)
        assert torch.equal(clone(x), model(x))
    landed.remove()
    assert "forward" not in model[0].__dict__


def _pickled(model: nn.Module) -> nn.Module:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


HIDDEN = 24


class _Twice(nn.Module):
    """Two blocks and a Linear called twice (a weight with two gradients in one pass)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN)
        self.shared = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(self.shared(self.down(torch.tanh(self.up(x)))))


def _train(rank: int, world_size: int, stage: int, land: bool) -> dict:
    import zerorun

    os.environ["ZERORUN_LAND_GRADS"] = "1" if land else "0"
    model = _Twice()
    zero: dict = {"stage": stage}
    if stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": zero}
    engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(6):
        x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(10 * step + rank))
        engine.backward(engine(x).square().mean())
        engine.step()
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        params = [q.detach().clone() for q in model.parameters()]
    return {"params": params, "landed": engine.parts.grad_sync.landed}


def _both(rank: int, world_size: int, stage: int) -> dict:
    return {"on": _train(rank, world_size, stage, True), "off": _train(rank, world_size, stage, False)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stage", [2, 3])
def test_the_engine_lands_gradients_and_trains_bit_for_bit_as_without(stage: int) -> None:
    for r in run_distributed(_both, 2, stage):
        on, off = r["on"], r["off"]
        assert off["landed"] == 0
        # up and down each micro-step; shared's two gradients are summed by autograd into a tensor of
        # its own (the slot went to the first), which the sync copies as before
        assert on["landed"] == 6 * 2, on["landed"]
        for a, b in zip(on["params"], off["params"], strict=True):
            assert torch.equal(a, b)
