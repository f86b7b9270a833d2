"""``checkpoint.tag_validation`` when ranks pass different tags (DeepSpeed's Ignore/Warn/Fail, world 2).

Fail raises DeepSpeed's error on every rank (an AssertionError there, so here too) and writes
nothing; Warn warns and saves one complete checkpoint under rank 0's tag; Ignore does the same
silently. Agreeing ranks save under their tag in every mode, and an empty ``save_dir`` is
DeepSpeed's ``ValueError``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import make_model

MODES = ("FAIL", "Warn", "ignore")  # any letter case, as DeepSpeed reads the key


def _save(rank: int, world: int, root: str) -> dict:
    import zerorun

    out: dict = {}
    for mode in MODES:
        cfg = {"train_batch_size": 2 * world, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               "checkpoint": {"tag_validation": mode}}
        engine, _, _, _ = zerorun.initialize(model=make_model(), config=cfg)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                path = engine.save_checkpoint(f"{root}/{mode}", tag=f"tag-{rank}")
                outcome = Path(path).name
            except AssertionError as e:  # DeepSpeed's exception type
                outcome = f"{type(e).__name__}: {e}"
            same = Path(engine.save_checkpoint(f"{root}/{mode}", tag="same")).name
        out[mode] = {"outcome": outcome, "same": same, "warned": [str(w.message) for w in caught
                                                                   if "not consistent" in str(w.message)]}
        try:
            engine.save_checkpoint("")
        except ValueError as e:
            out["empty"] = str(e)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("tags")
    return root, run_distributed(_save, 2, str(root), timeout=240)


def test_fail_raises_deepspeeds_error_on_every_rank_and_writes_nothing(results: tuple[Path, list[dict]]) -> None:
    root, per_rank = results
    for rank, r in enumerate(per_rank):
        assert r["FAIL"]["outcome"].startswith("TagMismatch: "), r["FAIL"]
        assert f"[rank={rank}] The checkpoint tag name 'tag-{rank}' is not consistent across all ranks" \
            in r["FAIL"]["outcome"]
    assert sorted(p.name for p in (root / "FAIL").iterdir() if not p.name.startswith(".")) == \
        ["latest", "same", "zero_to_fp32.py"]


@pytest.mark.parametrize(("mode", "warns"), [("Warn", True), ("ignore", False)])
def test_warn_and_ignore_save_one_complete_checkpoint_under_rank0s_tag(results: tuple[Path, list[dict]],
                                                                       mode: str, warns: bool) -> None:
    root, per_rank = results
    assert [r[mode]["outcome"] for r in per_rank] == ["tag-0", "tag-0"]
    assert [bool(r[mode]["warned"]) for r in per_rank] == [warns, warns]
    assert sorted(p.name for p in (root / mode / "tag-0").iterdir() if p.name.startswith("rank_")) == \
        ["rank_00000.pt", "rank_00001.pt"]
    assert not (root / mode / "tag-1").exists()


def test_agreeing_ranks_and_an_empty_save_dir(results: tuple[Path, list[dict]]) -> None:
    _, per_rank = results
    assert all(r[m]["same"] == "same" for r in per_rank for m in MODES)
    assert all(r["empty"] == "save_dir must be a non-empty string, got ''\nhint: pass the directory that holds "
               "the checkpoints, e.g. 'checkpoints'" for r in per_rank)
