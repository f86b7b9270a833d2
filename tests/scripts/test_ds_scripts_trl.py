"""TRL and PEFT under `zerorun --as-deepspeed`, run as users run them (tests/ds_scripts/trl_sft.py, trl_dpo.py).

SFTTrainer full (fp32 with non-reentrant gradient checkpointing, bf16) and with a LoRA
adapter and reentrant checkpointing at stage 3, DPOTrainer with a reference model (an engine without an optimizer) at
stages 2 and 3, and a generation step between training steps through TRL's
unwrap_model_for_generation at stage 3. Each run is compared with the same script without
DeepSpeed, in one process, with the global batch in one micro batch (as
tests/scripts/test_ds_scripts_hf.py): the loss and the gradient norm the Trainer logs at every step.
Every run starts from one saved tiny Llama: zero.Init initializes a new model in another order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ds_launch import ENV, SCRIPTS, launch

pytest.importorskip("trl")
pytest.importorskip("peft")
sys.path.insert(0, str(SCRIPTS))
from tiny_llama import save_tiny_llama  # noqa: E402

WORLD, MICRO, STEPS = 2, 2, 4
pytestmark = pytest.mark.timeout(300)
TRAINER_ARGS = ("--max_steps", str(STEPS), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
                "--learning_rate", "1e-2", "--warmup_steps", "0", "--seed", "7", "--num_samples", "32")
FP32 = ("--bf16", "false")  # TRL's configs default to bf16
NO_GC = ("--gradient_checkpointing", "false")  # ... and to gradient checkpointing
LORA = ("--use_peft",)
GENERATE = ("--generate_every", "2")
CPU_STATE = ("--accelerator_config", json.dumps({"use_configured_state": True}))  # see run_clm.cpu_deepspeed_state
# The parity tolerances of tests/scripts/test_ds_scripts_hf.py; bf16 (weights and activations in bf16, fp32 masters)
# against the fp32 reference: one bf16 rounding of the logits moves the loss by ~1e-4 relative, while a lost
# or repeated update (lr 1e-2) moves the later losses by ~1e-2.
FP32_TOL = {"loss": 1e-5, "grad_norm": 1e-4}
BF16_TOL = {"loss": 2e-3, "grad_norm": 3e-2}


def gradient_checkpointing(reentrant: bool) -> tuple[str, ...]:
    return ("--gradient_checkpointing", "true", "--gradient_checkpointing_kwargs",
            json.dumps({"use_reentrant": reentrant}))


def _results(out: Path) -> tuple[list[dict[str, float]], dict[str, Any]]:
    return json.loads((out / "log_history.json").read_text()), json.loads((out / "run.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded tiny Llama and its tokenizer, saved locally (nothing is downloaded)."""
    return save_tiny_llama(tmp_path_factory.mktemp("llama_tiny"))


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path):
    """The single-process run of a script and arguments, made once per module: one process, no DeepSpeed,
    micro batch = the global batch of the 2-rank runs."""
    made: dict[tuple[str, ...], tuple[list[dict[str, float]], dict[str, Any]]] = {}

    def reference(script: str, *args: str) -> tuple[list[dict[str, float]], dict[str, Any]]:
        if (script, *args) not in made:
            out = tmp_path_factory.mktemp("ref")
            argv = [sys.executable, str(SCRIPTS / script), "--model_name_or_path", str(checkpoint),
                    "--output_dir", str(out), "--per_device_train_batch_size", str(MICRO * WORLD), *args,
                    *TRAINER_ARGS]
            proc = subprocess.run(argv, cwd=out, env=ENV, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            made[(script, *args)] = _results(out)
        return made[(script, *args)]

    return reference


def _run(tmp_path: Path, checkpoint: Path, script: str, stage: int, *args: str):
    """The script on 2 ranks under `zerorun --as-deepspeed`, with the HF-style config of the stage."""
    out = launch(script, "--deepspeed", str(SCRIPTS / f"ds_config_zero{stage}.json"), "--model_name_or_path",
                 str(checkpoint), "--output_dir", str(tmp_path), "--per_device_train_batch_size", str(MICRO),
                 *args, *CPU_STATE, *TRAINER_ARGS, cwd=tmp_path, timeout=240)
    history, run = _results(tmp_path)
    assert [e["step"] for e in history] == list(range(1, STEPS + 1)), out[-3000:]
    assert run["engine"].startswith("zerorun.") and run["zero3"] is (stage == 3), run
    return history, run


def _assert_parity(got: list[dict[str, float]], want: list[dict[str, float]], tol: dict[str, float]) -> None:
    for key, rel in tol.items():
        assert [e[key] for e in got] == pytest.approx([e[key] for e in want], rel=rel, abs=1e-7), key


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_sft_full_stage3(tmp_path: Path, checkpoint: Path, references, dtype: str) -> None:
    """Every weight trained; TRL gathers the LM head itself for its fused loss (in forward and backward).
    fp32 with non-reentrant checkpointing (recomputation re-gathers the layers inside backward); bf16 needs
    --use_cpu on a machine without a GPU (transformers refuses bf16 otherwise), on DeepSpeed too."""
    want, ref_run = references("trl_sft.py", *FP32, *NO_GC, *GENERATE)
    if dtype == "fp32":
        args = (*FP32, *gradient_checkpointing(reentrant=False))
    else:
        args = ("--bf16", "true", "--use_cpu", *NO_GC)
    got, run = _run(tmp_path, checkpoint, "trl_sft.py", 3, *args)
    assert run["dtype"] == ("torch.float32" if dtype == "fp32" else "torch.bfloat16")
    assert run["checkpointing"] == ({"layers": 2, "use_reentrant": False} if dtype == "fp32"
                                    else {"layers": 0, "use_reentrant": None})
    assert run["trainable_params"] == ref_run["trainable_params"] > 0  # counted through ds_numel at stage 3
    _assert_parity(got, want, FP32_TOL if dtype == "fp32" else BF16_TOL)


def test_sft_lora_gradient_checkpointing_stage3(tmp_path: Path, checkpoint: Path, references) -> None:
    """A LoRA adapter over a frozen, sharded base; reentrant recomputation in backward re-gathers the base
    weights. The non-reentrant variant is test_sft_full_stage3[fp32]'s: with a PEFT model at ZeRO-3 TRL
    1.16 forces use_reentrant=True (for a DeepSpeed issue), whatever the user passed. The reference does
    not checkpoint: recomputing changes no value."""
    want, ref_run = references("trl_sft.py", *FP32, *NO_GC, *LORA)
    got, run = _run(tmp_path, checkpoint, "trl_sft.py", 3, *FP32, *LORA, *gradient_checkpointing(reentrant=True))
    assert run["trainable_params"] == ref_run["trainable_params"] == 1024  # 2 layers x (q, v) x (A 4x32 + B 32x4)
    assert run["checkpointing"] == {"layers": 2, "use_reentrant": True}
    assert ref_run["checkpointing"]["layers"] == 0
    _assert_parity(got, want, FP32_TOL)


@pytest.mark.parametrize("stage", [2, 3])
def test_dpo_with_reference_model(tmp_path: Path, checkpoint: Path, references, stage: int) -> None:
    """TRL loads the reference model and wraps it in an engine without an optimizer (prepare_deepspeed:
    sharded at stage 3, whole at stage 0 under a stage-2 policy); the DPO loss reads both models."""
    want, ref_run = references("trl_dpo.py", *FP32, *NO_GC)
    got, run = _run(tmp_path, checkpoint, "trl_dpo.py", stage, *FP32, *NO_GC)
    assert (run["ref_engine"], run["ref_has_optimizer"]) == ("zerorun.engine.inference", False)
    assert run["trainable_params"] == ref_run["trainable_params"]
    _assert_parity(got, want, FP32_TOL)


def test_generation_between_steps_stage3(tmp_path: Path, checkpoint: Path, references) -> None:
    """unwrap_model_for_generation + generate() after steps 2 and 4 (every parameter gathered, the hooks
    off and back on): the same tokens as the plain model at those steps, and the trajectory of a run
    without generation (the reference's losses, which test_sft_full_stage3 pins for a run without it)."""
    want, ref_run = references("trl_sft.py", *FP32, *NO_GC, *GENERATE)
    got, run = _run(tmp_path, checkpoint, "trl_sft.py", 3, *FP32, *NO_GC, *GENERATE)
    assert list(run["generations"]) == ["2", "4"]
    assert run["generations"] == ref_run["generations"]
    _assert_parity(got, want, FP32_TOL)
