"""Resuming with CUDA RNG states saved on a different number of visible GPUs.

GPUs cannot exist here: torch.cuda's availability, device count and per-device RNG setter are
replaced by a fake with ``visible`` devices whose setter fails for a device that does not exist,
as torch's does (``default_generators[index]``: IndexError).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from zerorun.engine.checkpoint.state import restore_rng


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, visible: int) -> dict[int, int]:
    restored: dict[int, int] = {}

    def set_rng_state(state: torch.Tensor, device: int | str = "cuda") -> None:
        index = int(device)
        if index >= visible:
            raise IndexError("tuple index out of range")
        restored[index] = int(state[0])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # what set_rng_state_all calls
    return restored


def _saved(devices: int) -> dict[str, object]:
    import random

    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": [torch.tensor([10 + i], dtype=torch.uint8) for i in range(devices)]}


@pytest.mark.parametrize(("saved", "visible"), [(8, 1), (2, 4)])
def test_the_matching_devices_are_restored_and_the_counts_named(monkeypatch: pytest.MonkeyPatch,
                                                                saved: int, visible: int) -> None:
    restored = _fake_cuda(monkeypatch, visible)
    with pytest.warns(RuntimeWarning, match=f"CUDA RNG states of {saved} device.*sees {visible}"):
        restore_rng(_saved(saved))
    assert restored == {i: 10 + i for i in range(min(saved, visible))}


def test_equal_counts_restore_all_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    restored = _fake_cuda(monkeypatch, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_rng(_saved(2))
    assert restored == {0: 10, 1: 11}
