"""Adam's state made at ``initialize``, not inside the first step.

torch's Adam and AdamW create ``exp_avg`` and ``exp_avg_sq`` lazily, inside the first
``step()``, between that step's temporaries. The allocator then places two model-sized sets
of long-lived buffers among short-lived ones: on the CPU (glibc), the first step of the
101.7M-parameter benchmark held 0-500 MiB more than any later step, run to run and rank to
rank, free heap that stayed resident (BENCHMARKS.md, issue 48), and a CUDA caching allocator
fragments the same way. Made up front, in one pass before training, the state is allocated
like the parameters, the first step is like every other, and the set-up's peak already holds
what training keeps. (DeepSpeed 0.19.8 leaves it lazy, as torch does.)

Only where the layout is known to be torch's own: the classes Adam and AdamW themselves and
zerorun's DeepSpeed Adam classes (their step reads the same keys). A subclass may add keys in
its own first step, so it keeps its lazy state, as does every other optimizer.
"""

from __future__ import annotations

import torch

_EXACT = (torch.optim.Adam, torch.optim.AdamW)
MARKER = "zerorun_adam_state"
"""A class attribute (True) by which an Adam subclass says its step reads torch's keys and no others."""


def has_known_adam_state(optimizer: torch.optim.Optimizer) -> bool:
    return type(optimizer) in _EXACT or getattr(type(optimizer), MARKER, False) is True


def _step_counter(group: dict, param: torch.Tensor) -> torch.Tensor:
    """``state["step"]`` as torch's Adam makes it: on the parameter's device in float32 for the
    fused and capturable kernels, else a host scalar in the default float type."""
    if group.get("fused") or group.get("capturable"):
        return torch.zeros((), dtype=torch.float32, device=param.device)
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.tensor(0.0, dtype=dtype, device="cpu")  # torch's own place for it, whatever the device


def make_adam_state(optimizer: torch.optim.Optimizer) -> int:
    """Create the zero state of every parameter that has none yet; the number of parameters given one
    (0 for an optimizer whose layout is not known: its state stays lazy)."""
    if not has_known_adam_state(optimizer):
        return 0
    made = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_meta:  # a simulated world: a meta step counter cannot be read as the number torch's step needs
                continue
            state = optimizer.state[p]
            if state:  # loaded, or stepped already: never overwritten
                continue
            state["step"] = _step_counter(group, p)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            made += 1
    return made
