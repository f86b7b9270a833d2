"""Misuse DeepSpeed 0.19.8 refuses with ``assert``: refused here as ``AssertionError`` in DeepSpeed's words
(scripts and DeepSpeed's own tests catch exactly that), each still an error with a hint.

``no_sync()`` at stage 2/3, re-entered, or ``step()`` inside it; ``initialize(dist_init_required=False)``
and ``init_distributed(dist_init_required=False)`` with no process group; an odd
``allgather_bucket_size`` at stages 1-2; ``ignore_unused_parameters: false`` with a parameter that got no
gradient, in DeepSpeed's CPU-offload path (stages 1-2).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import zerorun
from zerorun.compat import comm
from zerorun.engine.errors import EngineError
from zerorun.errors import ZerorunError


def _cfg(stage: int = 0, **zero: object) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage, **zero},
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}


def test_dist_init_required_false_without_a_group_asserts(world_of_one: None) -> None:
    assert not torch.distributed.is_initialized()
    with pytest.raises(AssertionError, match="Distributed backend is not initialized") as caught:
        zerorun.initialize(model=nn.Linear(4, 2), config=_cfg(), dist_init_required=False)
    assert isinstance(caught.value, ZerorunError) and caught.value.hint
    with pytest.raises(AssertionError, match="Please set dist_init_required to True"):
        comm.init_distributed("gloo", dist_init_required=False)
    assert not torch.distributed.is_initialized()
    zerorun.initialize(model=nn.Linear(4, 2), config=_cfg())  # then the group exists: False is fine
    zerorun.initialize(model=nn.Linear(4, 2), config=_cfg(), dist_init_required=False)


@pytest.mark.parametrize("stage", [2, 3])
def test_no_sync_at_stages_2_and_3_asserts(world_of_one: None, stage: int) -> None:
    engine, *_ = zerorun.initialize(model=nn.Linear(4, 2), config=_cfg(stage))
    words = f"no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage {stage}"
    with pytest.raises(AssertionError, match=words) as caught, engine.no_sync():
        pass
    assert isinstance(caught.value, EngineError)  # zerorun's callers catch this class, as before


def test_no_sync_reentry_and_step_inside_assert(world_of_one: None) -> None:
    engine, *_ = zerorun.initialize(model=nn.Linear(4, 2), config=_cfg(1))
    with engine.no_sync():
        with pytest.raises(AssertionError, match="no_sync context manager reentry is unsupported"), engine.no_sync():
            pass
        engine.backward(engine(torch.randn(2, 4)).sum())
        with pytest.raises(AssertionError, match=r"It is illegal to call Engine.step\(\) inside no_sync"):
            engine.step()
    engine.backward(engine(torch.randn(2, 4)).sum())
    engine.step()  # outside: the step runs
    assert engine.global_steps == 1


@pytest.mark.parametrize(("stage", "size", "refused"), [(2, 1001, True), (1, 7, True), (2, 1000, False),
                                                        (0, 1001, False), (3, 1001, False)])
def test_odd_allgather_bucket_size_asserts_at_stages_1_and_2(world_of_one: None, stage: int, size: int,
                                                             refused: bool) -> None:
    def build() -> None:
        zerorun.initialize(model=nn.Linear(4, 2), config=_cfg(stage, allgather_bucket_size=size))

    if not refused:
        build()
        return
    with pytest.raises(AssertionError, match="allgather_bucket_size must be a multiple of nccl_start_alignment_factor"):
        build()


class _HalfUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@pytest.mark.parametrize(("stage", "device", "ignore", "asserts"), [
    (2, "cpu", False, True), (1, "cpu", False, True), (2, "cpu", True, False), (2, "none", False, False),
    (3, "cpu", False, False)])
def test_unused_parameters_assert_where_deepspeed_reads_the_key(world_of_one: None, stage: int, device: str,
                                                                ignore: bool, asserts: bool) -> None:
    """``ignore_unused_parameters: false`` asserts at the step, in DeepSpeed's words, only in its CPU-offload
    path (stages 1-2); elsewhere the parameter without a gradient trains as zero, and the key warns."""
    cfg = _cfg(stage, ignore_unused_parameters=ignore, offload_optimizer={"device": device})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, *_ = zerorun.initialize(model=_HalfUsed(), config=cfg)
    warned = any("ignore_unused_parameters" in str(w.message) for w in caught)
    assert warned == (not ignore and not asserts)
    engine.backward(engine(torch.randn(2, 4)).sum())
    if asserts:
        with pytest.raises(AssertionError, match="enable ignore_unused_parameters option"):
            engine.step()
        return
    engine.step()
    assert engine.global_steps == 1
