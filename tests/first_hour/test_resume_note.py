"""Resume says what changed: world size (resharded), stage, global batch, accumulation, and the
data position, in the one line rank 0 prints at load. Before: "resumed at global step 6" only."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from zerorun.engine.checkpoint.manifest import Manifest
from zerorun.engine.checkpoint.resume_note import batch_facts, resume_line


def _engine(world: int, stage: int, micro: int, gas: int) -> Any:
    return SimpleNamespace(ctx=SimpleNamespace(world_size=world), zero_stage=stage,
                           train_batch_size=lambda: micro * gas * world, gradient_accumulation_steps=lambda: gas,
                           train_micro_batch_size_per_gpu=lambda: micro)


def test_a_resume_at_another_world_names_every_change() -> None:
    saved_by = _engine(2, 2, 4, 1)
    saved = {"counters": {"global_steps": 6}, "data": {"epoch": 0, "samples": 48}, "batch": batch_facts(saved_by)}
    manifest = Manifest(world_size=2, stage=2, dtype="bf16", zerorun_version="0", buckets=())
    line = resume_line(manifest, saved, _engine(3, 3, 4, 2))
    assert line == ("[zerorun] resumed at global step 6, epoch 0 after 48 samples; changed since the save: "
                    "world size 2 -> 3 (shards resharded), stage 2 -> 3, global batch 8 -> 24, accumulation 1 -> 2")
    assert resume_line(manifest, saved, saved_by) == "[zerorun] resumed at global step 6, epoch 0 after 48 samples"
    old = {"counters": {"global_steps": 6}}  # a checkpoint from before the batch was recorded
    assert resume_line(manifest, old, _engine(3, 2, 4, 1)).endswith("changed since the save: world size 2 -> 3 "
                                                                     "(shards resharded)")
