"""The Hugging Face path under `zerorun --as-deepspeed`: transformers' Trainer with `--deepspeed ds_config.json`
(HF-style "auto" values, filled in by the Trainer) at ZeRO stages 2 and 3, and accelerate's DeepSpeedPlugin.

The Trainer's reference is the same script without DeepSpeed, in one process, with the
global batch in one micro batch: accelerate shards a seeded sampler's batches across
ranks, so both see the same samples at every step. Compared: the loss and the gradient
norm before clipping the Trainer logs at every step, and the weights `save_model()` writes.
Stage 3 starts from a saved checkpoint: zero.Init initializes a new model in another
order than a plain build (rank 0, module by module), so only loaded weights are comparable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ds_launch import ENV, SCRIPTS, launch, mean_over_ranks, rank_losses

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, str(SCRIPTS))
import reference  # noqa: E402

WORLD, MICRO, STEPS = 2, 2, 5
pytestmark = pytest.mark.timeout(300)
TRAINER_ARGS = ("--max_steps", str(STEPS), "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
                "--learning_rate", "3e-3", "--warmup_steps", "2", "--seed", "7", "--num_samples", "40")
# Without a GPU, accelerate starts a multi-process DeepSpeed run only from a state the script configured
# itself (run_clm.py's cpu_deepspeed_state); the Trainer must then be told to use it.
CPU_STATE = ("--accelerator_config", json.dumps({"use_configured_state": True}))


def _history(out_dir: Path) -> list[dict[str, float]]:
    return json.loads((out_dir / "log_history.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded GPT-2 saved locally (what a fine-tuning run starts from; nothing is downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("gpt2_tiny")
    torch.manual_seed(3)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def _reference(out: Path, *model_args: str) -> list[dict[str, float]]:
    """run_clm.py without DeepSpeed, one process, micro batch = the global batch of the 2-rank runs."""
    argv = [sys.executable, str(SCRIPTS / "run_clm.py"), "--output_dir", str(out),
            "--per_device_train_batch_size", str(MICRO * WORLD), *model_args, *TRAINER_ARGS]
    proc = subprocess.run(argv, cwd=out, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _history(out)


def _model_args(config: str, start: str, checkpoint: Path) -> tuple[str, ...]:
    args = ("--model_name_or_path", str(checkpoint)) if start == "pretrained" else ()
    # DeepSpeed builds the config's AdamW over one parameter group, so every parameter decays; the
    # Trainer's own AdamW spares biases and LayerNorm weights. Decay only where both agree.
    return (*args, "--weight_decay", "0.01" if config == "ds_config_zero2.json" else "0.0")


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Callable[[str, str], Path]:
    """The plain Trainer's run for (config, start), run once and shared by the eager and compiled tests."""
    done: dict[tuple[str, str], Path] = {}

    def get(config: str, start: str) -> Path:
        if (config, start) not in done:
            out = tmp_path_factory.mktemp("ref")
            _reference(out, *_model_args(config, start, checkpoint))
            done[(config, start)] = out
        return done[(config, start)]

    return get


def _check_against(ref: Path, out_dir: Path, output: str) -> None:
    got, want = _history(out_dir), _history(ref)
    assert [e["step"] for e in got] == list(range(1, STEPS + 1)), output[-3000:]
    for key, rel in (("loss", 1e-5), ("grad_norm", 1e-4)):
        assert [e[key] for e in got] == pytest.approx([e[key] for e in want], rel=rel, abs=1e-7), key
    # trainer.save_model(): the full weights (gathered at stage 3; the tied head saved once) equal the
    # reference's. atol: one Adam step moves a weight by ~lr = 3e-3, so a lost or repeated step shows;
    # the attention key bias has a (mathematically) zero gradient whose rounding noise Adam amplifies
    # to ~2e-6, which rules out a tighter bound.
    saved, ref_saved = (load_file(d / "model.safetensors") for d in (out_dir, ref))
    assert saved.keys() == ref_saved.keys()
    for name, tensor in ref_saved.items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-5, atol=5e-5, msg=name)


CASES = [("ds_config_zero2.json", "new"), ("ds_config_zero3.json", "pretrained")]


@pytest.mark.parametrize(("config", "start"), CASES)
def test_trainer_matches_plain_trainer(tmp_path: Path, references: Callable[[str, str], Path], checkpoint: Path,
                                       config: str, start: str) -> None:
    """zero2: a new model, the Trainer's own AdamW (a client optimizer), its scheduler stepped by the Trainer.
    zero3: from_pretrained under zero.Init, the config's AdamW with "auto" params, the Trainer's scheduler
    handed to the engine (stepped by it)."""
    out = launch("run_clm.py", "--deepspeed", str(SCRIPTS / config), "--output_dir", str(tmp_path),
                 "--per_device_train_batch_size", str(MICRO), *_model_args(config, start, checkpoint), *CPU_STATE,
                 *TRAINER_ARGS, cwd=tmp_path, timeout=240)
    assert "engine.is_compiled: False" in out
    _check_against(references(config, start), tmp_path, out)


# stage 3 only: its compiled regions are the gather units; every stage compiles in tests/engine/test_engine_compile.py
@pytest.mark.parametrize(("config", "start"), CASES[1:])
def test_trainer_torch_compile(tmp_path: Path, references: Callable[[str, str], Path], checkpoint: Path,
                               config: str, start: str) -> None:
    """``--torch_compile`` (backend ``aot_eager``: no C++ toolchain, autograd through the graphs): accelerate
    calls ``engine.compile(backend=, compile_kwargs=)``; the run equals the plain Trainer's, as eager does.
    At stage 3 GPT-2's blocks (``transformer.h``) are the compiled regions, each one gather unit."""
    out = launch("run_clm.py", "--deepspeed", str(SCRIPTS / config), "--output_dir", str(tmp_path),
                 "--per_device_train_batch_size", str(MICRO), *_model_args(config, start, checkpoint), *CPU_STATE,
                 *TRAINER_ARGS, "--torch_compile_backend", "aot_eager", cwd=tmp_path, timeout=240)
    assert "engine.is_compiled: True" in out
    _check_against(references(config, start), tmp_path, out)


@pytest.mark.parametrize("stage", [2])
def test_accelerate_deepspeed_plugin(tmp_path: Path, stage: int) -> None:
    """Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=...)) + prepare + accelerator.backward."""
    launch("accelerate_deepspeed.py", "--zero_stage", str(stage), "--samples", "48", "--out_dir", str(tmp_path),
           cwd=tmp_path)
    got = mean_over_ranks([r["losses"] for r in rank_losses(tmp_path, WORLD)])
    want = reference.accelerate_loop(WORLD, micro=4, samples=48, lr=1e-3, clip=1.0)
    assert len(want) == 6
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
