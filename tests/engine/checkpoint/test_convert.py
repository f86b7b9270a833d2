"""`zerorun convert` and ``consolidate``: one state dict that a plain ``nn.Module`` loads strictly.

The model has a tied weight (stored once, written under both names), a BatchNorm
(buffers) and a frozen parameter (neither is in the engine's buckets), trained at
world size 1 in this process, saved, converted through the CLI entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from zerorun.cli import main


class TiedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.norm = nn.BatchNorm1d(6)
        self.frozen = nn.Parameter(torch.randn(6), requires_grad=False)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)) + self.frozen)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    import zerorun

    torch.manual_seed(0)
    model = TiedNet()
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2}}
    engine, _, _, _ = zerorun.initialize(model=model, config=cfg)
    for step in range(3):
        ids = torch.randint(0, 11, (8,), generator=torch.Generator().manual_seed(step))
        engine.backward(nn.functional.cross_entropy(engine(ids), ids))
        engine.step()
    root = tmp_path_factory.mktemp("ckpt")
    engine.save_checkpoint(str(root))
    return root, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _fresh() -> TiedNet:
    torch.manual_seed(123)
    return TiedNet()


def test_convert_pt_loads_strictly_into_a_plain_model(trained, tmp_path: Path, capsys) -> None:
    root, want = trained
    out = tmp_path / "model.pt"
    assert main(["convert", str(root), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    state = torch.load(out, weights_only=True)
    model = _fresh()
    model.load_state_dict(state, strict=True)
    assert model.head.weight is model.embed.weight
    got = model.state_dict()
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    assert torch.equal(got["norm.running_mean"], want["norm.running_mean"])
    assert not torch.equal(want["norm.running_mean"], torch.zeros(6))  # the buffers did move


def test_convert_safetensors_bf16_from_a_tag_directory(trained, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    root, want = trained
    out = tmp_path / "model.safetensors"
    assert main(["convert", str(root / "global_step3"), str(out), "--dtype", "bf16"]) == 0
    state = load_file(str(out))
    assert state["embed.weight"].dtype == torch.bfloat16
    assert torch.equal(state["head.weight"], state["embed.weight"])
    assert torch.equal(state["embed.weight"], want["embed.weight"].bfloat16())
    assert state["norm.num_batches_tracked"].dtype == torch.int64
    _fresh().load_state_dict(state, strict=True)


def test_missing_safetensors_gives_an_install_hint(trained, tmp_path: Path, monkeypatch, capsys) -> None:
    root, _ = trained
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    assert main(["convert", str(root), str(tmp_path / "m.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "needs the safetensors package" in err and "pip install 'zerorun[safetensors]'" in err
    assert not (tmp_path / "m.safetensors").exists()


def test_convert_errors(trained, tmp_path: Path, capsys) -> None:
    root, _ = trained
    assert main(["convert", str(tmp_path / "none"), str(tmp_path / "m.pt")]) == 1
    assert "no such checkpoint directory" in capsys.readouterr().err
    assert main(["convert", str(root), str(tmp_path / "m.pt"), "--tag", "nope"]) == 1
    assert "complete tags: global_step3" in capsys.readouterr().err
    assert main(["convert", str(root), str(tmp_path / "m.pt"), "--dtype", "int8"]) == 1
    assert "--dtype 'int8'" in capsys.readouterr().err
    assert main(["convert", str(tmp_path), str(tmp_path / "m.pt")]) == 1
    assert "neither manifest.json nor a 'latest' file" in capsys.readouterr().err
