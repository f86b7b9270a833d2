"""bench/memory.py's model facts: the counts its floors use are those of the models it trains."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "bench" / "memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_memory"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_memory"]


@pytest.mark.parametrize("system", ["torch-ddp", "zerorun-z3-ckpt", "zerorun-z3-lora"])
def test_model_facts_count_the_built_model(bench, system: str) -> None:
    args = bench.parse(["--small", "--world", "2"])
    model = bench.build(system, args)
    facts = bench.model_facts(system, args, 2)
    params = list(model.parameters())
    assert facts.trainable == sum(p.numel() for p in params if p.requires_grad)
    assert facts.frozen == sum(p.numel() for p in params if not p.requires_grad)
    block = model.blocks[0]
    assert facts.gathered_unit == sum(p.numel() for p in block.parameters())
    assert facts.unit == sum(p.numel() for p in block.parameters() if p.requires_grad)
    assert facts.largest_param == max(p.numel() for p in params)


def test_floors_follow_the_system_stage(bench) -> None:
    from zerorun.estimate import Dtype, Optimizer, Training
    from zerorun.estimate.floor import physical_floor

    args = bench.parse(["--small"])
    assert [bench.stage_of(s) for s in ("torch-ddp", "torch-fsdp2", "zerorun-z1", "zerorun-z3-lora", "ds-z2")] == \
        [0, 3, 1, 3, 2]
    m = bench.model_facts("torch-fsdp2", args, 2)
    want = physical_floor(Training(m.trainable, 2, Dtype.FP32, Optimizer.ADAMW), 3, unit=m.unit, bucket=m.largest_param,
                          activations=m.activations).total
    assert bench.floor_bytes("torch-fsdp2", args, 2) == want
    lora = bench.floor_bytes("zerorun-z3-lora", args, 2)
    assert lora < want  # frozen bases: no gradients, no optimizer state


def test_the_estimate_mode_measures_the_benchmark_model_and_config(bench) -> None:
    """``--estimate`` runs examples/train_toy.py: its MLP must be the benchmark's, parameter by parameter."""
    spec = importlib.util.spec_from_file_location("train_toy", ROOT / "examples" / "train_toy.py")
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    args = bench.parse(["--small", "--world", "4"])
    ours = [tuple(p.shape) for p in bench.build("zerorun-z0", args).parameters()]
    assert [tuple(p.shape) for p in toy.ToyMLP(args.hidden, args.layers).parameters()] == ours
    cfg = bench.measure_config(3, args)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_max_reuse_distance"] == 0
    assert zero["stage3_prefetch_bucket_size"] == bench.block_numel(args)  # one block, as the benchmark's z3
    assert cfg["train_micro_batch_size_per_gpu"] == args.micro_batch and cfg["optimizer"]["type"] == "AdamW"
    assert "stage3_max_reuse_distance" not in bench.measure_config(2, args)["zero_optimization"]
