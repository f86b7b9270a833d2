"""bf16 masters in the estimate: the bytes per parameter of each master mode at each stage, the rows, the
config's keys read, and `zerorun estimate` / `print-config` showing them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerorun.cli import main
from zerorun.estimate import (
    Dtype,
    Masters,
    Offload,
    Optimizer,
    Placement,
    PlacementError,
    Training,
    model_states,
)
from zerorun.estimate.in_flight import optimizer_temporaries
from zerorun.estimate.per_param import per_param

UPSTREAM = Path(__file__).resolve().parents[1] / "ds_scripts" / "bf16_master_weight" / "configs" / "bf16_full.json"


@pytest.mark.parametrize(("masters", "want"), [
    (Masters.FP32, {1: "4Ψ + 12Ψ/N", 2: "2Ψ + 16Ψ/N", 3: "18Ψ/N"}),
    # the master is the bf16 parameter buffer itself; bf16 gradient shard; bf16 moments (2 + 2)
    (Masters.BF16, {1: "4Ψ + 4Ψ/N", 2: "2Ψ + 6Ψ/N", 3: "8Ψ/N"}),
    (Masters.BF16_KAHAN, {1: "4Ψ + 6Ψ/N", 2: "2Ψ + 8Ψ/N", 3: "10Ψ/N"}),  # + the bf16 compensation buffer
    (Masters.BF16_STOCHASTIC, {1: "4Ψ + 4Ψ/N", 2: "2Ψ + 6Ψ/N", 3: "8Ψ/N"}),
])
def test_bytes_per_parameter_of_each_mode(masters: Masters, want: dict[int, str]) -> None:
    assert {s: per_param(s, masters).formula() for s in want} == want


def test_rows_hold_bf16_terms_and_offload_moves_a_bf16_master_copy() -> None:
    t = Training(8_000_000, 4, Dtype.BF16, Optimizer.ADAMW, masters=Masters.BF16)
    z3 = model_states(t, Placement(3))
    assert (z3.params, z3.gradients, z3.master_params, z3.optimizer_states) == (4_000_000, 4_000_000, 0, 8_000_000)
    off = model_states(t, Placement(3, Offload.CPU))
    # the bf16 master copy + moments + the host's bf16 gradient shard
    assert off.master_params == 4_000_000 and off.cpu == 4_000_000 + 8_000_000 + 4_000_000
    assert off.gpu["optimizer_states"] == 0 and off.gpu["gradients"] == 0
    fp32 = model_states(Training(8_000_000, 4, Dtype.BF16, Optimizer.ADAMW), Placement(3))
    assert fp32.total - z3.total == 10 * 8_000_000 // 4  # 18 - 8 bytes per parameter over N


def test_bf16_masters_need_bf16_compute_and_stage_1_to_3() -> None:
    with pytest.raises(PlacementError, match="bf16 compute"):
        Training(100, 2, Dtype.FP32, masters=Masters.BF16)
    with pytest.raises(PlacementError, match="stage 1, 2 or 3"):
        model_states(Training(100, 2, masters=Masters.BF16), Placement(0))


def test_bf16_masters_step_in_fp32_widened_chunks() -> None:
    for masters in (Masters.BF16, Masters.BF16_KAHAN):  # master, gradient, two moments and the sqrt, fp32
        assert optimizer_temporaries(Optimizer.ADAMW, 100, masters=masters) == 2000
    assert optimizer_temporaries(Optimizer.SGD, 100, masters=Masters.BF16) == 1200  # master, gradient, momentum


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_reads_the_masters_from_the_config_and_shows_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--params", "1B", "--gpus", "8", "--config", str(UPSTREAM))
    assert data["masters"] == "bf16"
    assert {r["stage"] for r in data["rows"]} == {1, 2, 3}  # no stage 0 with bf16 masters
    z3 = next(r for r in data["rows"] if r["stage"] == 3 and r["offload_optimizer"] == "none")
    assert z3["model_states_bytes"] == 8 * 10**9 // 8
    assert data["bytes_per_param"]["fp32"]["3"]["formula"] == "18Ψ/N"
    assert data["bytes_per_param"]["bf16-kahan"]["2"] == {"replicated": 2, "sharded": 8, "formula": "2Ψ + 8Ψ/N"}
    assert _json(capsys, "--params", "1B", "--gpus", "8", "--config", str(UPSTREAM), "--masters", "fp32"
                 )["masters"] == "fp32"
    assert main(["estimate", "--params", "1B", "--gpus", "8", "--masters", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bf16 masters (this estimate): stage 1 4Ψ + 4Ψ/N, stage 2 2Ψ + 6Ψ/N, stage 3 8Ψ/N" in out
    assert "fp32 masters: stage 0 16Ψ, stage 1 4Ψ + 12Ψ/N, stage 2 2Ψ + 16Ψ/N, stage 3 18Ψ/N" in out


def test_print_config_shows_each_modes_bytes_at_the_configs_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["print-config", str(UPSTREAM)]) == 0
    out = capsys.readouterr().out
    assert "model states per rank at stage 3 (bf16, adamw" in out
    lines = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()[-4:]}
    assert lines == {"fp32": "18Ψ/N", "bf16": "8Ψ/N  <- this config", "bf16-kahan": "10Ψ/N",
                     "bf16-stochastic": "8Ψ/N"}
