"""Estimates that advise: when nothing fits, the levers that would change the answer, largest
effect first, each with its figure (Llama 2 7B at sequence 4096 on 8 x 80 GB: only checkpointing
and flash attention make it fit, more nodes do not); after a recommendation, the print-config
command that writes that config. Before: "add GPUs, offload, or shrink the micro batch"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zerorun.cli import main

LLAMA = Path(__file__).parent / "fixtures" / "llama2-7b.json"


def test_nothing_fits_names_the_levers_in_order_of_effect(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", str(LLAMA), "--gpus", "8", "--gpu-memory", "80GB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no recommendation" in out and "add GPUs" not in out
    line = out.split("levers, largest effect first", 1)[1]
    figures = [(flag, float(gib)) for flag, gib in re.findall(r"(--[a-z-]+(?: [0-9a-z-]+)*): ([0-9.]+) GiB", line)]
    flags = [flag for flag, _ in figures]
    assert flags[0] == "--activation-checkpointing --flash-attention", flags
    assert {"--activation-checkpointing", "--flash-attention", "--seq-len 2048"} <= set(flags)
    assert [g for _, g in figures] == sorted(g for _, g in figures)
    # with everything offloaded the device holds no model state that more ranks would shard: more nodes
    # change nothing, so they are not offered
    assert "--nodes 2" not in flags


def test_a_recommendation_ends_with_the_command_that_writes_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--params", "14B", "--gpus", "8", "--gpu-memory", "80GB"]) == 0
    want = "next: zerorun print-config --stage 1 --dtype bf16 --optimizer adam --masters fp32 --micro-batch 1 -o ds_config.yaml"
    assert want in capsys.readouterr().out
