"""The small things a newcomer trips over: keys that do nothing warn once, the engine's
progress and memory lines for people (steps from 1, MiB/GiB), the same error on every
rank reported once, and sizes with units."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from launcher.watch.report import Failure, format_report
from zerorun.config import ConfigWarning, load_config
from zerorun.engine.metrics import format_memory
from zerorun.estimate import CountError, GiB, parse_gpu_memory


def test_keys_without_effect_warn_once_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {
        "stage": 3, "reduce_scatter": False, "elastic_checkpoint": True, "ignore_unused_parameters": False,
        "offload_optimizer": {"device": "cpu", "ratio": 0.5, "pipeline_read": True}}}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):  # a script loading its config again (every epoch, say) is not warned again
            load_config(str(path))
    texts = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    for key in ("reduce_scatter", "elastic_checkpoint", "ignore_unused_parameters",
                "offload_optimizer.pipeline_read"):
        assert sum(f"zero_optimization.{key}:" in t for t in texts) == 1, (key, texts)
    assert not any("offload_optimizer.ratio" in t for t in texts), texts  # Twin-Flow: the engine reads it
    assert all("no effect in zerorun's engine" in t for t in texts)
    quiet = tmp_path / "quiet.json"  # the defaults (what the engine does anyway) say nothing
    quiet.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_scatter": True}}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(str(quiet))
    assert not [w for w in caught if issubclass(w.category, ConfigWarning)]


def test_gpu_memory_units() -> None:
    assert parse_gpu_memory("80") == parse_gpu_memory("80G") == parse_gpu_memory("80GiB") == 80 * GiB
    assert parse_gpu_memory("80GB") == 80 * GiB  # the label of an "80 GB" card: 80 GiB (zerorun.estimate.cards)
    for impossible in ("80B", "0", "100TiB"):
        with pytest.raises(CountError, match="not the memory of one GPU"):
            parse_gpu_memory(impossible)


def test_memory_breakdown_for_people() -> None:
    line = format_memory({"params": 3 * 2**20, "gradients": 512, "optimizer_states": 5 * GiB})
    assert line == "params 3.00 MiB | gradients 512 B | optimizer_states 5.00 GiB | total 5.00 GiB"


def test_same_error_on_every_rank_is_shown_once() -> None:
    tail = ("Traceback (most recent call last):", "  ...", "FileNotFoundError: data.bin")
    failures = [Failure("n1", 0, 1, 100.0 + r, rank=r, local_rank=r, stderr_tail=tail) for r in range(4)]
    failures.append(Failure("n1", 0, 1, 110.0, rank=4, local_rank=4, stderr_tail=("KeyError: 'x'",)))
    text = format_report(failures, world_size=5)
    assert text.count("FileNotFoundError: data.bin") == 1
    assert "Also failed with the same error (exit code 1): rank(s) 1, 2, 3" in text
    assert "rank 4: exit code 1" in text and "KeyError: 'x'" in text




def test_progress_counts_steps_from_one_and_logs_memory_for_people(world_of_one: None,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import zerorun

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 2, "memory_breakdown": True,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    engine, _, _, _ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=config)
    for _ in range(4):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[zerorun]")]
    assert [line.split(" | ")[0] for line in lines if "loss" in line or "lr" in line][:2] == [
        "[zerorun] step 2", "[zerorun] step 4"]  # the 2nd and 4th optimizer steps: counted from 1
    memory = [line for line in lines if "memory:" in line]
    # 10 parameters in 16-byte aligned slots: the bias (2), 6 elements of padding, the weight (8): 64 B
    assert len(memory) == 2 and "params 64 B" in memory[0] and "total" in memory[0] and "{" not in memory[0]
