"""`zerorun convert --to hf` and `--to dcp`, and DCP directories that ``load_checkpoint`` reads.

- ``--to hf --max_shard_size``: several safetensors shards and an index whose tensors equal
  the single-file convert (fp32 and bf16), read by ``safetensors`` and by the index's map;
- ``--to dcp``: ``torch.distributed.checkpoint.load`` fills a plain model's ``state_dict()``
  to the exact weights;
- a DCP directory of a plain model (``dcp.save(model.state_dict())``, and one under
  ``{"model": ...}``) loads into a stage-3 engine at world 2 with ``load_module_only=True``
  to the exact weights; a ``.metadata`` that names a foreign global is refused.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.checkpoint.test_checkpoint_cases import CASES, snapshot
from tests.engine.checkpoint.test_convert import TiedNet, _fresh, trained  # noqa: F401  (fixture)
from zerorun.cli import main
from zerorun.engine.checkpoint import CheckpointError, consolidate
from zerorun.torch_compat import dcp_one_process


def _cli(*args: str) -> None:
    assert main(["convert", *args]) == 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_hf_shards_equal_the_single_file(trained: Any, tmp_path: Path, dtype: str) -> None:  # noqa: F811
    from safetensors.torch import load_file

    root, _ = trained
    out = tmp_path / "hf"
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "toy"}')
    _cli(str(root), str(out), "--to", "hf", "--max_shard_size", "100B", "--dtype", dtype, "--config", str(cfg))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and all(f.endswith(f"-of-{len(files):05d}.safetensors") for f in files)
    got: dict[str, torch.Tensor] = {}
    for f in files:
        shard = load_file(out / f)
        assert all(index["weight_map"][k] == f for k in shard)
        got.update(shard)
    want = consolidate(root, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in want.values())
    assert (out / "config.json").read_text() == cfg.read_text()
    model = _fresh()
    model.load_state_dict(got)  # strict: every key of the plain model, nothing else


def test_hf_one_shard_is_model_safetensors(trained: Any, tmp_path: Path) -> None:  # noqa: F811
    root, _ = trained
    _cli(str(root), str(tmp_path / "hf"), "--to", "hf")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["model.safetensors"]


def test_dcp_convert_fills_a_plain_model(trained: Any, tmp_path: Path) -> None:  # noqa: F811
    import torch.distributed.checkpoint as dcp

    root, want = trained
    _cli(str(root), str(tmp_path / "dcp"), "--to", "dcp")
    model = _fresh()
    state = model.state_dict()
    dcp_one_process(dcp.load, state, str(tmp_path / "dcp"))
    model.load_state_dict(state)
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k].to(v.dtype)), k


def _plain_model() -> Any:
    from tests.engine.test_engine_cases import make_model

    return make_model(4321)


def _load_dcp_rank(rank: int, world: int, root: str) -> dict[str, Any]:
    import zerorun
    from tests.engine.test_engine_cases import make_model

    out = {}
    for name in ("plain", "nested"):
        engine, _, _, _ = zerorun.initialize(model=make_model(1), config=CASES[3].config(world))
        engine.load_checkpoint(str(Path(root) / name), load_module_only=True)
        out[name] = snapshot(engine)["params"]
    return out


def test_dcp_directory_loads_into_a_stage3_engine(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model = _plain_model()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    dcp_one_process(dcp.save, model.state_dict(), str(tmp_path / "plain"))
    dcp_one_process(dcp.save, {"model": model.state_dict()}, str(tmp_path / "nested"))
    for rank, got in enumerate(run_distributed(_load_dcp_rank, 2, str(tmp_path), timeout=240)):
        for name, params in got.items():
            assert params.keys() == want.keys()
            for n in want:
                assert torch.equal(params[n], want[n]), (rank, name, n)


class Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("ran code",))


def test_dcp_metadata_naming_a_foreign_global_is_refused(tmp_path: Path) -> None:
    from zerorun.engine.checkpoint.dcp_format import read_metadata

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="builtins.print"):
        read_metadata(tmp_path)


def test_save_16bit_model_writes_the_hf_layout(tmp_path: Path, monkeypatch: Any) -> None:
    """``save_filename="model.safetensors"``: HF's layout (sharded above the limit), the same tensors as the .pt."""
    from safetensors.torch import load_file

    import zerorun
    from zerorun.engine.checkpoint import save16

    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**6, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2}}
    engine, _, _, _ = zerorun.initialize(model=TiedNet(), config=cfg)
    engine.save_16bit_model(str(tmp_path / "pt"), "pytorch_model.bin")
    engine.save_16bit_model(str(tmp_path / "one"), "model.safetensors")
    monkeypatch.setattr(save16, "HF_SHARD_BYTES", 100)
    engine.save_16bit_model(str(tmp_path / "sharded"), "model.safetensors")
    want = torch.load(tmp_path / "pt" / "pytorch_model.bin", weights_only=True)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    for got in (load_file(tmp_path / "one" / "model.safetensors"),
                {k: v for f in set(index["weight_map"].values()) for k, v in load_file(tmp_path / "sharded" / f).items()}):
        assert got.keys() == want.keys()
        assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    assert want["embed.weight"].dtype == torch.bfloat16
