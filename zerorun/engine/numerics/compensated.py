"""The step of bf16 masters in fp32 arithmetic, and updates they would lose: Kahan compensation or
stochastic rounding of the step.

Every chunk of bf16 masters steps in fp32 temporaries - the master (plus its compensation), its
gradient and its moments, one chunk (at most one bucket) at a time - and is stored back in bf16.
Without a compensation (``nearest``, the mode of ``bf16.master_compensation: none``) each stored
value is rounded to nearest once: what DeepSpeed 0.19.8's fused Adam does over bf16 masters and
moments (its CPU kernel and its CUDA kernel compute in fp32), where torch's optimizers over bf16
tensors would round after every operation (``v * beta2`` with beta2 = 0.999 rounds back to ``v``).

With bf16 masters (``bf16.bf16_master_weights_and_grads``) an update smaller than half a bf16
ulp of its weight (2^-9 relative) rounds away, every step: at small learning rates training
stalls. ``bf16.master_compensation`` (a zerorun key; DeepSpeed 0.19.8 has neither) keeps them:

- ``kahan``: the rounding error of the stored master is kept in a bf16 buffer of the master's
  size and added back before the next step (+2 bytes per parameter, in the optimizer's state as
  ``zerorun_kahan``, so checkpoints and offload carry it like a moment).
- ``stochastic_rounding``: the new master is rounded up or down with probability by distance,
  so the expected stored value is the fp32 result (+0 bytes per parameter; a generator per rank).

The moments are rounded to nearest either way (they are not accumulated across tiny steps).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

KAHAN_KEY = "zerorun_kahan"
MODES = ("nearest", "kahan", "stochastic_rounding")
BYTES_PER_PARAM = {"nearest": 0, "kahan": 2, "stochastic_rounding": 0}
"""Extra resting bytes per parameter of each mode, over the bf16 master."""


def stochastic_round(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` (fp32) to bf16, rounding up with probability (distance to the lower bf16 value) / ulp.

    bf16 is fp32's upper 16 bits: add 16 random low bits, then truncate them (exact in ``.to``)."""
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32, device=x.device)
    bits = torch.bitwise_and(x.view(torch.int32) + noise, -65536)
    return torch.where(torch.isfinite(x), bits.view(torch.float32), x).to(torch.bfloat16)


class Compensation:
    """Steps a chunk of bf16 masters in fp32 (see the module docstring); one per master store."""

    def __init__(self, mode: str, rank: int, device: torch.device) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.generator = torch.Generator(device=device).manual_seed(0x5EED + rank)

    @contextlib.contextmanager
    def widened(self, optimizer: torch.optim.Optimizer, masters: list[nn.Parameter]) -> Iterator[None]:
        """Inside: ``masters``, their gradients and moments are fp32 temporaries; after: bf16 again, in place."""
        kept = []
        for m in masters:
            state = optimizer.state[m]
            stored = m.data
            wide = stored.float()
            if self.mode == "kahan" and KAHAN_KEY in state:
                wide.add_(state.pop(KAHAN_KEY))
            moments = {k: v for k, v in state.items() if torch.is_tensor(v) and v.shape == stored.shape}
            for k, v in moments.items():
                state[k] = v.float()
            m.data = wide
            if m.grad is not None:
                m.grad = m.grad.float()
            kept.append((m, stored, moments))
        yield
        for m, stored, moments in kept:
            self._narrow(optimizer.state[m], m, stored, moments)

    def _narrow(self, state: dict, m: nn.Parameter, stored: torch.Tensor, moments: dict) -> None:
        wide = m.data
        if self.mode == "kahan":
            stored.copy_(wide)
            state[KAHAN_KEY] = (wide - stored.float()).to(torch.bfloat16)
        elif self.mode == "nearest":
            stored.copy_(wide)
        else:
            stored.copy_(stochastic_round(wide, self.generator))
        for k, v in state.items():  # the moments back into their bf16 storage (made now on the first step)
            if k != KAHAN_KEY and torch.is_tensor(v) and v.dtype == torch.float32 and v.shape == stored.shape:
                state[k] = moments[k].copy_(v) if k in moments else v.to(torch.bfloat16)
        m.data = stored
