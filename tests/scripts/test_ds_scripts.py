"""Real-shaped DeepSpeed scripts (tests/ds_scripts/) run with zero edits under `zerorun --as-deepspeed`.

Each run is 2 CPU ranks on gloo, launched exactly as DeepSpeed's launcher would be
(`--deepspeed --deepspeed_config ds.json`, `--local_rank` passed to the script), and its
losses are compared step by step with a single-process PyTorch reference of the same
seeds and data (tests/ds_scripts/reference.py). fp32 throughout: the ranks' reduction
order differs from the reference's, so losses agree to ~1e-6, not bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ds_launch import SCRIPTS, launch, mean_over_ranks, rank_losses, write_config

sys.path.insert(0, str(SCRIPTS))
import reference  # noqa: E402  (lives next to the scripts, imports their tiny_models)

WORLD = 2
RTOL, ATOL = 1e-5, 1e-6
pytestmark = pytest.mark.timeout(240)


def _close(got: list[float], want: list[float]) -> None:
    assert got == pytest.approx(want, rel=RTOL, abs=ATOL), f"\n got {got}\nwant {want}"


@pytest.mark.parametrize("stage", [0, 3])  # stage 1 runs the longtail script below; every stage: tests/engine
def test_cifar_matches_reference(tmp_path: Path, stage: int) -> None:
    """add_config_arguments + get_accelerator + training_data loader + the config's optimizer."""
    cfg = write_config(tmp_path / "ds_config.json", {
        "train_batch_size": 8,
        "steps_per_print": 2000,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.8, 0.999], "eps": 1e-8}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
    })
    out = launch("cifar10_deepspeed.py", "--deepspeed", "--deepspeed_config", str(cfg), "--samples", "48",
                 "--out_dir", str(tmp_path), cwd=tmp_path)
    assert f"zero_stage={stage}" in out
    runs = rank_losses(tmp_path, WORLD)
    want = reference.cifar(WORLD, micro=4, samples=48, lr=0.01, betas=(0.8, 0.999), clip=1.0)
    assert len(want) == 6
    _close(mean_over_ranks([r["losses"] for r in runs]), want)
    assert runs[0]["lr"] == [0.01]


@pytest.mark.parametrize("stage", [0, 2])
def test_gan_two_engines_client_optimizers(tmp_path: Path, stage: int) -> None:
    """Two engines, client Adam optimizers, modules called directly; G's loss also leaves gradients in D,
    which `netD.zero_grad()` must clear before D's next step (at stage 0 it did not)."""
    cfg = write_config(tmp_path / "gan_ds_config.json", {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
    })
    launch("gan_deepspeed_train.py", "--deepspeed", "--deepspeed_config", str(cfg), "--samples", "32",
           "--out_dir", str(tmp_path), cwd=tmp_path)
    runs = rank_losses(tmp_path, WORLD)
    want = reference.gan(batch=8, samples=32, lr=0.0002, beta1=0.5, seed=999)
    for rank in runs:  # every rank draws the same batches: each one must match the reference
        _close([d for d, _ in rank["losses"]], [d for d, _ in want])
        _close([g for _, g in rank["losses"]], [g for _, g in want])


@pytest.mark.parametrize("stage", [3])
def test_bert_checkpoint_resume(tmp_path: Path, stage: int) -> None:
    """Train 3 steps and save_checkpoint(client_state=...); a second launch loads it and trains steps 4-6."""
    ckpt = ("--zero_stage", str(stage), "--checkpoint_every", "3", "--checkpoint_dir", str(tmp_path / "ckpt"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    launch("train_bert_ds.py", *ckpt, "--num_iterations", "3", "--out_dir", str(first), cwd=tmp_path)
    out = launch("train_bert_ds.py", *ckpt, "--num_iterations", "6", "--load_checkpoint_dir", str(tmp_path / "ckpt"),
                 "--out_dir", str(second), cwd=tmp_path)
    assert "Resumed from step 3" in out
    want = reference.bert(WORLD, micro=4, steps=6, lr=1e-2, clip=1.0)
    got_first = mean_over_ranks([list(r["losses"].values()) for r in rank_losses(first, WORLD)])
    _close(got_first, [want[s] for s in (1, 2, 3)])
    got_second = mean_over_ranks([list(r["losses"].values()) for r in rank_losses(second, WORLD)])
    _close(got_second, [want[s] for s in (4, 5, 6)])


@pytest.mark.parametrize(("stage", "autocast", "offload"), [(1, False, True), (3, False, True), (2, True, False)])
def test_longtail_script_matches_reference(tmp_path: Path, stage: int, autocast: bool, offload: bool) -> None:
    """A top-level MoE import on a dense model, an op-builder probe, safe_get_full_grad in a logging hook,
    offload_states/reload_states between steps, torch_autocast."""
    config = {"train_batch_size": 8, "steps_per_print": 2000, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage}}
    if autocast:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    cfg = write_config(tmp_path / "ds_config.json", config)
    launch("longtail_deepspeed.py", "--deepspeed", "--deepspeed_config", str(cfg), "--samples", "48",
           "--out_dir", str(tmp_path), *(["--offload_states"] if offload else []), cwd=tmp_path)
    runs = rank_losses(tmp_path, WORLD)
    want_losses, want_norms = reference.longtail(WORLD, micro=4, samples=48, lr=0.01, autocast=autocast)
    assert len(want_losses) == 6
    rel = 2**-7 if autocast else RTOL  # bf16 forward: the ranks' and the reference's roundings differ
    got = mean_over_ranks([r["losses"] for r in runs])
    assert got == pytest.approx(want_losses, rel=rel, abs=ATOL), f"\n got {got}\nwant {want_losses}"
    for r in runs:  # every rank sees the same full gradient
        assert r["grad_norms"] == pytest.approx(want_norms, rel=rel * 4, abs=ATOL)
