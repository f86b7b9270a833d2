"""Stage 3: a parameter gathered anywhere stays whole until autograd has used it (world 1, in process).

Fine-tuning libraries gather weights themselves: TRL's fused LM-head loss gathers the
head with ``GatheredParameters`` in its forward and again inside its backward, and a
gradient hook may read a weight whose gradient is still to come. When such a context
ends inside forward or backward, the bucket is handed to the gather coordinator instead
of being released: it stays whole until its gradients are in (or the pass ends), so the
gradient autograd is about to store always finds its parameter at full shape. Each case
trains as plain torch does, and the pass ends with nothing gathered.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from zerorun.engine.mechanism.param_state import ParamState

WIDTH, CLASSES = 12, 5


@pytest.fixture(autouse=True, scope="module")
def _world_of_one() -> object:
    """These engines are worlds of one in this process: leave no process group to later modules."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _config() -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                  "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}}


def _gathered(weight: torch.Tensor):
    import zerorun

    return zerorun.zero.GatheredParameters([weight])


class FusedHead(torch.autograd.Function):
    """logits = h @ W.T and a squared loss in one function; the caller gathers W around ``apply`` (autograd
    records the inputs' shapes there), and the backward gathers it again (TRL's fused LM-head loss)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        logits = h @ weight.t()
        ctx.save_for_backward(h, weight)
        return logits.square().mean()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        h, weight = ctx.saved_tensors
        with _gathered(weight):  # this bucket's gradient is what this backward returns
            logits = h @ weight.t()
            g = grad * 2 * logits / logits.numel()
            return g @ weight, g.t() @ h


class Net(nn.Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.body = nn.Linear(WIDTH, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        if self.case == "hook":  # a gradient hook reads body.weight, whose gradient is still to come
            h.register_hook(lambda g: g * (1 + self._weight_norm()))
        h = torch.tanh(self.mid(h))
        if self.case == "fused":
            with _gathered(self.head.weight):
                return FusedHead.apply(h, self.head.weight)
        if self.case == "forward":  # gathered by hand in forward; autograd keeps views of it
            with _gathered(self.head.weight):
                logits = h @ self.head.weight.t()
            return logits.square().mean()
        return self.head(h).square().mean()

    def _weight_norm(self) -> torch.Tensor:
        with _gathered(self.body.weight), torch.no_grad():
            return self.body.weight.norm().detach()


def _reference_norm(model: Net) -> torch.Tensor:
    with torch.no_grad():
        return model.body.weight.norm()


@pytest.mark.parametrize("case", ["fused", "hook", "forward"])
def test_a_parameter_gathered_inside_forward_or_backward_trains_as_plain_torch(case: str) -> None:
    import zerorun

    def build() -> Net:
        torch.manual_seed(3)
        return Net(case)

    model, ref = build(), build()
    ref._weight_norm = lambda: _reference_norm(ref)  # type: ignore[method-assign]
    engine, *_ = zerorun.initialize(model=model, config=_config())
    coordinator = engine.parts.coordinator
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(step))
        loss = engine(x)
        engine.backward(loss)
        engine.step()
        assert all(b.state is ParamState.SHARDED for b in coordinator.buckets) and not coordinator.live
        opt.zero_grad()
        ref_loss = ref(x)
        ref_loss.backward()
        opt.step()
        torch.testing.assert_close(loss.detach(), ref_loss.detach())
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        for a, b in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.detach(), b.detach())
