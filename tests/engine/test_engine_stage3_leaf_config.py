"""Stage 3 leaf modules from the config (DeepSpeed 0.19.8's ``zero_optimization.leaf_module`` and
``stage3_module_granularity_threshold``): the flagged subtree is one unit, and training is unchanged.

The spawned test trains the same model on 2 gloo ranks without and with each key and compares the
losses bit for bit (DeepSpeed's own test asserts equal loss lists); the pure tests check which modules
each key flags, with DeepSpeed's granularity rule worked by hand.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn

from tests.dist_harness import run_distributed
from zerorun.config import load_config
from zerorun.engine.mechanism.leaves import LEAF_ATTR, by_granularity, flag_leaves, granularities

H = 8


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(H, H, bias=False)
        self.down = nn.Linear(H, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(H, 4 * H)
        self.narrow = nn.Linear(4 * H, H)
        self.blocks = nn.ModuleList([MLP() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.narrow(torch.tanh(self.wide(x)))
        for b in self.blocks:
            x = x + b(x)
        return x


def test_granularity_is_parameters_per_layer_and_skips_containers() -> None:
    net = Net()
    sizes = granularities(net)
    assert sizes[id(net.blocks[0])] == (2 * H * H) // 3  # 128 elements over its 2 Linears + itself
    assert sizes[id(net.blocks)] == sys.maxsize and sizes[id(net.wide)] == sys.maxsize  # container, torch leaf
    total = sum(p.numel() for p in net.parameters())
    assert sizes[id(net)] == total // (2 + 3 * 3 + 1) == 78  # so 50 stops below the root, above the blocks
    assert by_granularity(net, 50) == [net.blocks[0], net.blocks[1], net.blocks[2]]
    assert by_granularity(net, 10**7) == [net]  # the root first: nothing under it is visited
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert by_granularity(net, 10) == []
    assert "flags no module" in str(caught[0].message)


def test_leaf_module_keys_flag_by_class_name_and_suffix() -> None:
    net = Net()
    fq = f"{MLP.__module__}.{MLP.__qualname__}"
    zero = load_config({"zero_optimization": {"stage": 3, "leaf_module": {"classes": fq}}}).zero_optimization
    assert flag_leaves(net, zero) == list(net.blocks)
    net = Net()
    zero = load_config({"zero_optimization": {"stage": 3, "leaf_module": {
        "classes": [], "names": "wide", "name_suffixes": ["2"]}}}).zero_optimization
    assert flag_leaves(net, zero) == [net.wide, net.blocks[2]]
    assert getattr(net.blocks[2], LEAF_ATTR) and not hasattr(net.blocks[0], LEAF_ATTR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flag_leaves(Net(), load_config({"zero_optimization": {"stage": 3, "leaf_module": {
            "names": "nowhere"}}}).zero_optimization)
    assert "no module matches ['nowhere']" in str(caught[0].message)


def _train(rank: int, world: int, zero: dict) -> dict:
    import zerorun

    torch.manual_seed(0)
    model = Net()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_reuse_distance": 0, **zero}}
    engine, *_ = zerorun.initialize(model=model, config=config)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            x = torch.randn(2, H, generator=torch.Generator().manual_seed(10 * step + rank))
            loss = engine(x).square().mean()
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
    units = [(u.name, u.leaf) for u in engine.parts.units]
    engine.destroy()
    warned = any("no input requires grad" in str(w.message) for w in caught)
    return {"losses": losses, "units": units, "warned": warned}


def _runs(rank: int, world: int) -> dict:
    fq = f"{MLP.__module__}.{MLP.__qualname__}"
    return {name: _train(rank, world, zero) for name, zero in [
        ("plain", {}), ("classes", {"leaf_module": {"classes": [fq]}}),
        ("threshold", {"stage3_module_granularity_threshold": 50}),
        ("root", {"stage3_module_granularity_threshold": 10**7})]}


def test_leaf_keys_train_as_without_them() -> None:
    for r in run_distributed(_runs, 2, timeout=240):
        plain = r["plain"]
        assert not any(leaf for _, leaf in plain["units"]) and not plain["warned"]
        for name in ("classes", "threshold"):
            assert r[name]["losses"] == plain["losses"], name  # bit for bit, as DeepSpeed's test asserts
            assert [n for n, leaf in r[name]["units"] if leaf] == ["blocks.0", "blocks.1", "blocks.2"], name
            assert len(r[name]["units"]) == len(plain["units"]) - 3  # each block: one unit, not its two Linears
            assert not r[name]["warned"]  # the blocks' inputs require grad
        root = r["root"]
        assert root["losses"] == plain["losses"] and root["units"] == [("<root>", True)]
        assert root["warned"]  # the root's input needs no grad: DeepSpeed raises there, zerorun says so
