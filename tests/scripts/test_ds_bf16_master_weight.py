"""DeepSpeedExamples' ``training/bf16_master_weight/train.py`` with its ``configs/bf16_full.json``, both byte
for byte (tests/ds_scripts/bf16_master_weight/), under ``zerorun --as_deepspeed --num_gpus 2``: bf16 masters,
gradients and moments with torch_autocast and bf16.enabled, at stage 3 (the upstream file unchanged) and at
stages 1-3 with a larger learning rate, against DeepSpeed 0.19.8's losses on the same CPU job
(tests/fixtures/bf16_master_weight_losses.json, made by tests/fixtures/make_bf16_master_weight_losses.py).

The script calls ``torch.cuda.set_device`` unconditionally; tests/ds_scripts/cuda_on_cpu/ makes that a no-op on
a CPU-only torch, for DeepSpeed's fixture run and for this one alike. The loss is a bf16 scalar (the logits
come out of autocast in bf16), so the tolerance is bf16's: DeepSpeed's and zerorun's reductions round
differently, and one rounding of a weight by a bf16 ulp moves a later loss by about one ulp of the loss.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from ds_launch import SCRIPTS, launch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_bf16_master_weight_losses import CUDA_ON_CPU, case_config, read_losses  # noqa: E402

RECORDED = json.loads((FIXTURES / "bf16_master_weight_losses.json").read_text())
BF16_ULP_AT_4 = 2.0**-5  # the spacing of bf16 values in [4, 8): the losses here are ~4.2-4.5
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("case", sorted(RECORDED["cases"]))
def test_upstream_example_matches_deepspeeds_losses(tmp_path: Path, case: str) -> None:
    recorded = RECORDED["cases"][case]
    config = case_config(recorded["overrides"], tmp_path)
    losses = tmp_path / "losses.csv"
    out = launch("bf16_master_weight/train.py", "--deepspeed_config", str(config), *RECORDED["args"],
                 "--loss_log_file", str(losses), cwd=tmp_path, timeout=280,
                 env={"PYTHONPATH": os.pathsep.join([str(CUDA_ON_CPU), os.environ.get("PYTHONPATH", "")])})
    assert "SUMMARY: config=" in out  # the script ran to its end
    got, want = read_losses(losses), recorded["losses"]
    assert len(got) == len(want)
    assert got[0] == want[0], (got, want)  # the same weights, data and bf16 forward: the first loss is exact
    assert got == pytest.approx(want, abs=2 * BF16_ULP_AT_4), f"\n got {got}\nwant {want}"


def test_the_stage_3_case_is_the_upstream_file_itself() -> None:
    assert case_config(RECORDED["cases"]["z3"]["overrides"], Path("/nonexistent")) == \
        SCRIPTS / "bf16_master_weight" / "configs" / "bf16_full.json"
