"""The Hugging Face path under `zerorun --as-deepspeed`: transformers' Trainer with `--deepspeed ds_config.json`
(HF-style "auto" values, filled in by the Trainer) at ZeRO stages 2 and 3, and accelerate's DeepSpeedPlugin.

The Trainer's reference is the same script without DeepSpeed, in one process, with the
global batch in one micro batch: accelerate shards a seeded sampler's batches across
ranks, so both see the same samples at every step. Compared per step: the loss, the
gradient norm before clipping, and the learning rate the Trainer logs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ds_launch import ENV, SCRIPTS, launch, mean_over_ranks, rank_losses

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
sys.path.insert(0, str(SCRIPTS))
import reference  # noqa: E402

WORLD, MICRO, STEPS = 2, 2, 5
pytestmark = pytest.mark.timeout(300)
TRAINER_ARGS = ("--max_steps", str(STEPS), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
                "--learning_rate", "3e-3", "--warmup_steps", "2", "--weight_decay", "0.01", "--seed", "7",
                "--num_samples", "40")


def _history(out_dir: Path) -> list[dict[str, float]]:
    return json.loads((out_dir / "log_history.json").read_text())


@pytest.fixture(scope="module")
def trainer_reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    """run_clm.py without DeepSpeed, one process, micro batch = the global batch of the 2-rank runs."""
    out = tmp_path_factory.mktemp("clm_reference")
    argv = [sys.executable, str(SCRIPTS / "run_clm.py"), "--output_dir", str(out),
            "--per_device_train_batch_size", str(MICRO * WORLD), *TRAINER_ARGS]
    proc = subprocess.run(argv, cwd=out, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _history(out)


@pytest.mark.parametrize("config", ["ds_config_zero2.json", "ds_config_zero3.json"])
def test_trainer_matches_plain_trainer(tmp_path: Path, trainer_reference: list[dict[str, float]],
                                       config: str) -> None:
    """zero2: Trainer's own AdamW (a client optimizer); zero3: the config's AdamW with "auto" params + zero.Init."""
    # --ddp_backend gloo: without a GPU, accelerate joins the process group only for a named backend
    out = launch("run_clm.py", "--deepspeed", str(SCRIPTS / config), "--output_dir", str(tmp_path),
                 "--per_device_train_batch_size", str(MICRO), "--ddp_backend", "gloo", *TRAINER_ARGS,
                 cwd=tmp_path, timeout=240)
    got = _history(tmp_path)
    assert [e["step"] for e in got] == list(range(1, STEPS + 1)), out[-3000:]
    for key, rel in (("loss", 1e-5), ("grad_norm", 1e-4), ("learning_rate", 1e-9)):
        want = [e[key] for e in trainer_reference]
        assert [e[key] for e in got] == pytest.approx(want, rel=rel, abs=1e-7), key


@pytest.mark.parametrize("stage", [2, 3])
def test_accelerate_deepspeed_plugin(tmp_path: Path, stage: int) -> None:
    """Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=...)) + prepare + accelerator.backward."""
    launch("accelerate_deepspeed.py", "--zero_stage", str(stage), "--samples", "48", "--out_dir", str(tmp_path),
           cwd=tmp_path)
    got = mean_over_ranks([r["losses"] for r in rank_losses(tmp_path, WORLD)])
    want = reference.accelerate_loop(WORLD, micro=4, samples=48, lr=1e-3, clip=1.0)
    assert len(want) == 6
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
