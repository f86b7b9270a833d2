"""DeepSpeed's ``zero_to_fp32`` entry points on zerorun and DeepSpeed checkpoints equal `zerorun convert`.

A 2-rank stage-3 run of test_convert's model (a tied weight, a frozen parameter, BatchNorm
buffers) saves a checkpoint; `zerorun convert` of it is the reference. The same state dict
must come from ``deepspeed.utils.zero_to_fp32`` (zerorun's compat package, in a fresh
interpreter), from the ``zero_to_fp32.py`` written into the save directory (run with
zerorun made unimportable: plain Python and torch), sharded or not, and for a DeepSpeed
fixture the entry point must give what DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint``
gave (recorded with the fixture).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.checkpoint.test_convert import TiedNet
from zerorun.cli import main

SITEDIR = Path(__file__).resolve().parents[3] / "zerorun" / "compat" / "sitedir"
DS_FIXTURES = Path(__file__).parents[2] / "fixtures" / "ds_checkpoints"


def _train_and_save(rank: int, world: int, root: str) -> None:
    import zerorun

    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 3}}
    engine, *_ = zerorun.initialize(model=TiedNet(), config=cfg)
    for step in range(2):
        ids = torch.randint(0, 11, (8,), generator=torch.Generator().manual_seed(step))[rank * 4:(rank + 1) * 4]
        engine.backward(torch.nn.functional.cross_entropy(engine(ids), ids))
        engine.step()
    engine.save_checkpoint(root)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    root = tmp_path_factory.mktemp("zr")
    run_distributed(_train_and_save, 2, str(root / "ckpt"), timeout=120)
    out = root / "convert.pt"
    assert main(["convert", str(root / "ckpt"), str(out)]) == 0
    return root / "ckpt", torch.load(out, weights_only=True)


def _python(code: str, cwd: Path, pythonpath: Path | None = None) -> None:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_the_compat_entry_points_equal_zerorun_convert(saved, tmp_path: Path) -> None:
    root, want = saved
    assert "frozen" in want and "head.weight" in want and "norm.running_mean" in want
    _python(f"""
import torch, deepspeed.utils.zero_to_fp32 as z
from tests.engine.checkpoint.test_convert import TiedNet
assert z.__name__ == "deepspeed.utils.zero_to_fp32"
torch.save(z.get_fp32_state_dict_from_zero_checkpoint({str(root)!r}), {str(tmp_path / "get.pt")!r})
torch.save(z.get_fp32_state_dict_from_zero_checkpoint({str(root)!r}, tag="global_step2", exclude_frozen_parameters=True),
           {str(tmp_path / "nofrozen.pt")!r})
z.convert_zero_checkpoint_to_fp32_state_dict({str(root)!r}, {str(tmp_path / "out")!r})
torch.manual_seed(5)
model = z.load_state_dict_from_zero_checkpoint(TiedNet(), {str(root)!r})
torch.save(model.state_dict(), {str(tmp_path / "model.pt")!r})
""", cwd=Path(__file__).resolve().parents[3], pythonpath=SITEDIR)
    _assert_same(torch.load(tmp_path / "get.pt", weights_only=True), want)
    _assert_same(torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True), want)
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    _assert_same(loaded, {k: want[k] for k in loaded})
    nofrozen = torch.load(tmp_path / "nofrozen.pt", weights_only=True)
    _assert_same(nofrozen, {k: v for k, v in want.items() if k != "frozen"})


def test_the_script_in_the_save_directory_needs_only_torch(saved, tmp_path: Path) -> None:
    root, want = saved
    assert (root / "zero_to_fp32.py").is_file()
    out, sharded = tmp_path / "out", tmp_path / "sharded"
    _python(f"""
import runpy, sys
sys.modules["zerorun"] = None  # any import of zerorun fails
sys.argv = ["zero_to_fp32.py", ".", {str(out)!r}]
runpy.run_path("zero_to_fp32.py", run_name="__main__")
sys.argv = ["zero_to_fp32.py", ".", {str(sharded)!r}, "--max_shard_size", "300B", "-t", "global_step2"]
runpy.run_path("zero_to_fp32.py", run_name="__main__")
""", cwd=root)
    _assert_same(torch.load(out / "pytorch_model.bin", weights_only=True), want)
    index = json.loads((sharded / "pytorch_model.bin.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and sorted(index["weight_map"]) == sorted(want)
    merged: dict[str, torch.Tensor] = {}
    for f in files:
        merged.update(torch.load(sharded / f, weights_only=True))
    _assert_same(merged, want)


@pytest.mark.parametrize("case", ["stage2_fp32", "stage3_bf16", "stage2_fp32_elastic", "stage3_fp32_extras"])
def test_deepspeed_checkpoints_convert_as_deepspeed_converts_them(case: str, tmp_path: Path) -> None:
    from zerorun.engine.checkpoint.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    expected = torch.load(DS_FIXTURES / case / "expected.pt", weights_only=True)["zero_to_fp32"]
    _assert_same(get_fp32_state_dict_from_zero_checkpoint(DS_FIXTURES / case), expected)
    assert main(["convert", str(DS_FIXTURES / case), str(tmp_path / "m.pt")]) == 0
    _assert_same(torch.load(tmp_path / "m.pt", weights_only=True), expected)
