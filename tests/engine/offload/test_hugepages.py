"""Host masters and optimizer state in 2 MiB pages (zerorun.engine.offload.hugepages): where the kernel
hands them out, and a step over them that is bit for bit the step over 4 KiB pages."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import zerorun
from zerorun.engine.offload import hugepages

WIDTH = 1024  # one 1024x1024 layer: a 4 MiB fp32 master, the smallest that moves


pytestmark = pytest.mark.usefixtures("world_of_one")  # tests/conftest.py


def _huge_kib(t: torch.Tensor) -> int:
    """AnonHugePages of the mapping that holds ``t``'s first whole 2 MiB page (/proc/self/smaps; the advice
    splits the mapping there)."""
    address, inside = hugepages.aligned_span(t.data_ptr(), t.numel() * t.element_size())[0], False
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_the_aligned_span_is_the_whole_pages_inside() -> None:
    page = hugepages.PAGE
    assert hugepages.aligned_span(page, 3 * page) == (page, 3 * page)
    assert hugepages.aligned_span(page + 16, 3 * page) == (2 * page, 2 * page)  # a torn page at each end
    assert hugepages.aligned_span(page + 16, page) == (2 * page, 0)  # none whole


def test_a_huge_copy_has_the_values_and_sits_in_huge_pages() -> None:
    if not hugepages.wanted():
        pytest.skip("transparent huge pages are not on request here (see /sys/kernel/mm/transparent_hugepage)")
    t = torch.randn(8 << 20)  # 32 MiB
    out = hugepages.huge_copy(t)
    assert out is not t and torch.equal(out, t)
    assert _huge_kib(out) >= 2048, "the kernel gave no 2 MiB page to the advised copy"
    assert hugepages.huge_copy(out) is out  # copied once
    small, strided = torch.randn(1000), t[::2]
    assert hugepages.huge_copy(small) is small and hugepages.huge_copy(strided) is strided


def _engine() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 8))
    config = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6,
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    engine, opt, _, _ = zerorun.initialize(model=model, config=config)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        engine.backward(engine(torch.randn(4, WIDTH, generator=g)).square().mean())
        engine.step()
    return engine, opt


def test_offloaded_masters_and_state_step_in_huge_pages_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, opt = _engine()
    masters = engine.parts.masters.masters
    big = [m for m in masters if m.numel() * m.element_size() >= hugepages.MIN_BYTES]
    assert big, "no master large enough to move: the test would prove nothing"
    moved = [m.data for m in big] + [v for m in big for v in opt.state[m].values() if v.numel() > 1]
    huge = [p.detach().clone() for p in engine.module.parameters()]
    state = [v.clone() for v in moved[len(big):]]
    if hugepages.wanted():
        assert all(_huge_kib(t) >= 2048 for t in moved), "a master or a moment is not in 2 MiB pages"
    dist.destroy_process_group()
    monkeypatch.setattr(hugepages, "wanted", lambda: False)  # 4 KiB pages: the same step
    engine, opt = _engine()
    assert all(torch.equal(a, b.detach()) for a, b in zip(huge, engine.module.parameters(), strict=True))
    plain = [v for m in engine.parts.masters.masters if m.numel() * m.element_size() >= hugepages.MIN_BYTES
             for v in opt.state[m].values() if v.numel() > 1]
    assert len(plain) == len(state) and all(torch.equal(a, b) for a, b in zip(state, plain, strict=True))
