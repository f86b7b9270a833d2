"""The one line rank 0 prints at load: where the run continues and what changed since the save.

A checkpoint loads at any world size and stage; that is the point, and also how a job
resumed on another allocation silently trains with another global batch. So the line
names each difference: world size (the shards were resharded), stage, global batch,
accumulation steps, and the data position (``epoch E after S samples``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerorun.engine.checkpoint.manifest import Manifest

if TYPE_CHECKING:
    from zerorun.engine.views import BatchFacts, CheckpointView


def batch_facts(engine: BatchFacts) -> dict[str, int]:
    """What a save records of the batch arithmetic, to compare at the next load."""
    return {"train_batch_size": engine.train_batch_size(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu()}


def changes(manifest: Manifest, saved: dict[str, Any], engine: CheckpointView) -> list[str]:
    was = {"world size": manifest.world_size, "stage": manifest.stage, **(saved.get("batch") or {})}
    now = {"world size": engine.ctx.world_size, "stage": engine.zero_stage, **batch_facts(engine)}
    labels = {"world size": "world size", "stage": "stage", "train_batch_size": "global batch",
              "gradient_accumulation_steps": "accumulation", "train_micro_batch_size_per_gpu": "micro batch"}
    found = []
    for key, label in labels.items():  # facts, not behaviour: each difference is reported alike
        if key in was and was[key] != now[key]:
            found.append(f"{label} {was[key]} -> {now[key]}" + (" (shards resharded)" if key == "world size" else ""))
    return found


def resume_line(manifest: Manifest, saved: dict[str, Any], engine: CheckpointView) -> str:
    text = f"[zerorun] resumed at global step {saved['counters']['global_steps']}"
    data = saved.get("data")
    if data is not None:
        text += f", epoch {data['epoch']} after {data['samples']} samples"
    found = changes(manifest, saved, engine)
    return text + (f"; changed since the save: {', '.join(found)}" if found else "")
