"""The estimate answers ZeRO-Offload's user: a 7B model on one 24 GB card and a Qwen2-14B shape on two, with fp32
masters; the levers say what each knob would change, with its figure; `next:` writes a config of exactly the
recommended row (the estimate of that config recommends the same row, to the byte)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from zerorun.cli import main

QWEN = Path(__file__).parent / "fixtures" / "qwen2-14b.json"  # Qwen2.5-14B's config.json keys
QWEN_RUN = ["--model", str(QWEN), "--gpus", "2", "--gpu-memory", "24GB", "--seq-len", "2048", "--micro-batch", "1",
            "--activation-checkpointing"]
SEVEN_B = ["--params", "7B", "--gpus", "1", "--gpu-memory", "24GB"]


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["estimate", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("args", [SEVEN_B, QWEN_RUN], ids=["7B-1x24GB", "qwen2-14B-2x24GB"])
def test_recommended_with_fp32_masters_and_no_gradients_on_the_device(capsys: pytest.CaptureFixture[str],
                                                                      args: list[str]) -> None:
    data = _json(capsys, *args)
    rec = data["recommendation"]
    assert data["masters"] == "fp32" and rec["stage"] is not None, rec["reason"]
    assert rec["offload_optimizer"] == "cpu" and rec["per_gpu_bytes"] <= data["usable_bytes"]
    for row in data["rows"]:
        if row["offload_optimizer"] != "none":  # invariant 8: no gradient shard, no master on the device
            assert row["per_gpu_bytes"]["gradients"] == row["per_gpu_bytes"]["optimizer_states"] == 0


def test_next_writes_a_config_that_gives_the_recommended_row(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    text = _text(capsys, *QWEN_RUN)
    command = " ".join(text.split("next:", 1)[1].split("\n", 1)[0].split())
    words = shlex.split(command)
    assert words[:2] == ["zerorun", "print-config"] and "--template" not in words
    out = tmp_path / "ds_config.yaml"
    words[words.index("-o") + 1] = str(out)
    assert main(words[1:]) == 0
    capsys.readouterr()
    want = _json(capsys, *QWEN_RUN)["recommendation"]
    got = _json(capsys, *QWEN_RUN, "--config", str(out))["recommendation"]
    assert {k: got[k] for k in ("stage", "offload_optimizer", "offload_param", "per_gpu_bytes")} == \
        {k: want[k] for k in ("stage", "offload_optimizer", "offload_param", "per_gpu_bytes")}
    assert "bf16_master_weights_and_grads" not in out.read_text()  # fp32 masters: no key keeps them in 16 bits


def _levers(text: str) -> dict[str, str]:
    line = next(line for line in text.splitlines() if line.startswith("levers"))
    return dict(re.findall(r"(--[a-z-]+(?: [0-9a-z]+)*(?: --[a-z-]+(?: [0-9a-z]+)*)*): ([0-9.]+ GiB \([^)]*\))",
                           line))


def test_levers_name_offload_masters_and_nodes_with_their_figures(capsys: pytest.CaptureFixture[str]) -> None:
    levers = _levers(_text(capsys, "--params", "7B", "--gpus", "2", "--gpu-memory", "24GB",
                           "--offload-optimizer", "none"))
    assert levers["--offload-optimizer cpu"].endswith("(stage 1, offload opt:cpu fits at 15.5 GiB)")
    assert {"--offload-optimizer cpu --offload-param cpu", "--masters bf16", "--nodes 2"} <= set(levers)
    assert all(re.match(r"[0-9.]+ GiB", figure) for figure in levers.values())


def test_levers_name_micro_batch_sequence_and_checkpointing(capsys: pytest.CaptureFixture[str]) -> None:
    levers = _levers(_text(capsys, "--model", str(QWEN), "--gpus", "2", "--gpu-memory", "24GB", "--seq-len", "2048",
                           "--micro-batch", "4", "--offload-optimizer", "cpu", "--offload-param", "none"))
    assert {"--micro-batch 2", "--seq-len 1024", "--activation-checkpointing",
            "--offload-optimizer cpu --offload-param cpu"} <= set(levers)


def test_a_recommendation_names_the_levers_that_change_it(capsys: pytest.CaptureFixture[str]) -> None:
    text = _text(capsys, *SEVEN_B)
    line = " ".join(text.split("levers that change the recommendation", 1)[1].split("\n", 1)[0].split())
    assert "--offload-optimizer cpu --offload-param cpu: 3.5 GiB (stage 3, offload opt:cpu par:cpu fits)" in line
