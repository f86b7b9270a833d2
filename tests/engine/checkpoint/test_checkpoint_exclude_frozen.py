"""``save_checkpoint(exclude_frozen_parameters=True)`` (DeepSpeed's argument; a LoRA run saves its adapters alone),
at world 2, stages 1 and 3, with the synchronous and the decoupled writer.

The model's first layer is frozen. Saved with the flag, extra.pt holds the module's buffers but no frozen
parameter and the manifest lists none; without it both hold them. A fresh engine built from another seed loads
the checkpoint: its trainable parameters are the saved ones, its frozen layer keeps its own values.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.dist_harness import run_distributed
from zerorun.engine.checkpoint.manifest import EXTRA, MANIFEST, Manifest

FROZEN = {"0.weight", "0.bias"}


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    return model


def _engine(stage: int, seed: int, decoupled: bool):  # type: ignore[no-untyped-def]
    import zerorun

    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    if decoupled:
        cfg["checkpoint"] = {"writer": {"decoupled": True}}
    model = _model(seed)
    return zerorun.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                              config=cfg)[0]


def _params(engine) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    import zerorun

    with zerorun.zero.GatheredParameters(list(engine.module.parameters())):
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _rank(rank: int, world: int, root: str, stage: int, decoupled: bool) -> dict:
    from zerorun.engine.checkpoint.decoupled import settle

    engine = _engine(stage, 1, decoupled)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(x).square().mean())
    engine.step()
    saved = _params(engine)
    for name, exclude in (("all", False), ("trainable", True)):
        engine.save_checkpoint(str(Path(root) / name), tag="t", exclude_frozen_parameters=exclude)
    settle(engine)
    fresh = _engine(stage, 2, decoupled)
    own = _params(fresh)
    fresh.load_checkpoint(str(Path(root) / "trainable"), tag="t")
    return {"saved": saved, "own": own, "loaded": _params(fresh)}


@pytest.mark.parametrize("stage,decoupled", [(1, False), (3, False), (3, True)],
                         ids=["stage1", "stage3", "stage3-decoupled"])
def test_frozen_parameters_are_left_out(tmp_path: Path, stage: int, decoupled: bool) -> None:
    results = run_distributed(_rank, 2, str(tmp_path), stage, decoupled, timeout=240)
    extras = {name: torch.load(tmp_path / name / "t" / EXTRA, weights_only=True) for name in ("all", "trainable")}
    manifests = {name: Manifest.from_json((tmp_path / name / "t" / MANIFEST).read_text()) for name in extras}
    assert set(extras["all"]) >= FROZEN and set(manifests["all"].frozen) == FROZEN
    assert not FROZEN & set(extras["trainable"]) and manifests["trainable"].frozen == []
    assert "1.running_mean" in extras["trainable"]  # buffers are kept
    for r in results:
        for n, p in r["loaded"].items():
            want = r["own"][n] if n in FROZEN else r["saved"][n]
            torch.testing.assert_close(p, want, msg=lambda m, n=n: f"{n}: {m}")
        assert not torch.equal(r["own"]["0.weight"], r["saved"]["0.weight"])  # the seeds differ: the check can fail
