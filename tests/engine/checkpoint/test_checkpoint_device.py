"""Loaded optimizer state goes where torch.optim keeps it, not where the file was read to.

Checkpoint files are read with ``map_location="cpu"``. Tensors the size of a shard are
copied into state on the master's device; scalars (Adam's ``step``) stay on the CPU for
the default (foreach) kernels but must be on the parameter's device for fused or
capturable ones. No GPU here: the device rule is checked as a function, with a CUDA
device object (no CUDA call is made), and against torch's own placement on the CPU.
"""

from __future__ import annotations

import torch

from zerorun.engine.checkpoint.load import group_of, scalar_state_device

CUDA = torch.device("cuda", 0)


def test_scalar_state_follows_torch_optim() -> None:
    assert scalar_state_device({"fused": False, "capturable": False}, CUDA) == torch.device("cpu")
    assert scalar_state_device({"fused": True}, CUDA) == CUDA
    assert scalar_state_device({"capturable": True}, CUDA) == CUDA
    for fused in (False, True):  # torch's own choice, where it can be observed here
        p = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.AdamW([p], fused=fused)
        p.grad = torch.ones(3)
        opt.step()
        assert opt.state[p]["step"].device == scalar_state_device(group_of(opt, p), p.device)


def test_group_of_finds_the_parameters_group() -> None:
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 2.0}])
    assert group_of(opt, b)["lr"] == 2.0 and group_of(opt, torch.ones(1)) == {}
