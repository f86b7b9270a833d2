"""``zero.Init`` refuses to shard over a group of one rank when the launcher started several (world 1, in process).

A process group of one rank made before ``zero.Init`` (a ``from_pretrained`` before
``init_distributed()``) under ``WORLD_SIZE=2`` would leave every parameter whole on every
rank; DeepSpeed 0.19.8 raises a ``RuntimeError`` naming ``WORLD_SIZE`` and ``init_distributed``,
and so does zerorun. A group passed explicitly is taken as intended; no ``WORLD_SIZE``, or a
malformed one, says nothing.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch import nn

from zerorun.compat.zero_init import Init as DeepSpeedInit
from zerorun.engine.comm.launcher_world import ContradictingWorld, contradicting_single_rank_group
from zerorun.zero import Init

STAGE3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}


@pytest.fixture(autouse=True, scope="module")
def _world_of_one() -> object:
    """A group of one rank made by someone else before ``zero.Init``; none is left to later modules."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_rule() -> None:
    why = contradicting_single_rank_group(dp_world_size=1, explicit_process_group=None, env={"WORLD_SIZE": "8"})
    assert why is not None and "WORLD_SIZE=8" in why and "init_distributed" in why
    assert contradicting_single_rank_group(1, None, {"WORLD_SIZE": "1"}) is None
    assert contradicting_single_rank_group(1, None, {}) is None
    assert contradicting_single_rank_group(8, None, {"WORLD_SIZE": "8"}) is None
    assert contradicting_single_rank_group(1, object(), {"WORLD_SIZE": "8"}) is None
    for bad in ("", "not-an-int", None):
        assert contradicting_single_rank_group(1, None, {"WORLD_SIZE": bad}) is None


def test_zero_init_refuses_a_world_of_one_under_a_launcher_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2") as err, Init(config=STAGE3):
        nn.Linear(4, 4)
    assert isinstance(err.value, ContradictingWorld) and "init_distributed" in (err.value.hint or "")
    assert nn.Linear(4, 4).weight.numel() == 16  # the refusal left no constructor patched
    with DeepSpeedInit(config_dict_or_path=STAGE3, data_parallel_group=dist.group.WORLD):  # explicit: intended
        layer = nn.Linear(4, 4)
    assert layer.weight.numel() == 0  # sharded over the one rank (its data a placeholder at rest)


def test_zero_init_shards_without_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with Init(config=STAGE3):
        layer = nn.Linear(4, 4)
    assert layer.weight.numel() == 0
