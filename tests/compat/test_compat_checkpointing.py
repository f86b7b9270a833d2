"""``deepspeed.checkpointing``: recomputed activations give the gradients of a plain forward.

A block with dropout (drawn from the default generator and from the tracker's
model-parallel state) is run once plainly and once checkpointed from the same RNG
states: the outputs and every gradient must be equal, which holds only if the
recomputation replays the forward's random draws.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerorun.compat import checkpointing as ckpt
from zerorun.errors import UnsupportedFeature


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(torch.tanh(self.a(x)), 0.5)
        with ckpt.get_cuda_rng_tracker().fork():
            h = nn.functional.dropout(h, 0.3)  # a "model-parallel region" draw
        return self.b(h)


def _run(checkpointed: bool, x_requires_grad: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    block = Block()
    ckpt.model_parallel_cuda_manual_seed(7)
    x = torch.randn(4, 6, requires_grad=x_requires_grad)
    out = ckpt.checkpoint(block, x) if checkpointed else block(x)
    out.square().sum().backward()
    grads = [p.grad for p in block.parameters()] + ([x.grad] if x_requires_grad else [])
    return out.detach(), grads


@pytest.fixture(autouse=True)
def fresh_settings() -> None:
    ckpt.configure(None)


@pytest.mark.parametrize("cpu_checkpointing", [False, True])
@pytest.mark.parametrize("x_requires_grad", [False, True])
def test_checkpointed_block_equals_the_plain_one(cpu_checkpointing: bool, x_requires_grad: bool) -> None:
    ckpt.configure(None, checkpoint_in_cpu=cpu_checkpointing)
    want_out, want_grads = _run(False, x_requires_grad)
    got_out, got_grads = _run(True, x_requires_grad)
    assert torch.equal(got_out, want_out)
    assert len(got_grads) == len(want_grads) and all(g is not None for g in got_grads)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_configure_reads_the_config_block_and_arguments_win() -> None:
    assert ckpt.is_configured()
    ckpt.configure(None, deepspeed_config={"train_batch_size": 1, "activation_checkpointing": {
        "cpu_checkpointing": True, "number_checkpoints": 4, "profile": True}}, profile=False)
    s = ckpt.SETTINGS
    assert (s.cpu_checkpointing, s.number_checkpoints, s.profile, s.partition_activations) == (True, 4, False, False)


class _MPU:
    def __init__(self, size: int) -> None:
        self.size = size

    def get_model_parallel_world_size(self) -> int:
        return self.size

    def get_model_parallel_rank(self) -> int:
        return 1 if self.size > 1 else 0


def test_partitioning_across_model_parallel_ranks_is_a_named_error() -> None:
    ckpt.configure(_MPU(1), partition_activations=True)  # one model-parallel rank: nothing to partition
    with pytest.raises(UnsupportedFeature, match="activation partitioning across model-parallel ranks"):
        ckpt.configure(_MPU(2), partition_activations=True)


def test_tracker_and_seeding_follow_deepspeed() -> None:
    ckpt.configure(_MPU(2))
    ckpt.model_parallel_cuda_manual_seed(5)
    default_draw = torch.rand(3)
    with ckpt.get_cuda_rng_tracker().fork():
        forked = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(default_draw, torch.rand(3))
    torch.manual_seed(5 + 2718 + 1)  # seed + 2718 + the tensor-parallel rank
    assert torch.equal(forked, torch.rand(3))
    with pytest.raises(ValueError, match="already exists"):
        ckpt.get_cuda_rng_tracker().add("other", 5 + 2718 + 1)
