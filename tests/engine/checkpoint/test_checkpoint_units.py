"""Pure parts of the checkpoint format: reshard arithmetic, manifest round trip, error wording, atomic writes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.engine.checkpoint.test_checkpoint_cases import CASES, build, train
from tests.engine.test_engine_cases import Tiny
from zerorun.engine.checkpoint import CheckpointError, list_tags
from zerorun.engine.checkpoint.atomic import write_text
from zerorun.engine.checkpoint.manifest import BucketEntry, Manifest, ParamEntry, layout_differences
from zerorun.engine.checkpoint.reshard import chunk_pieces, plan_copies, ranks_to_read
from zerorun.engine.mechanism.buckets import plan_buckets, round_up


def _layout(shapes: list[tuple[int, ...]], bucket: int, world: int) -> tuple[BucketEntry, ...]:
    plans = plan_buckets([torch.Size(s) for s in shapes], bucket, world)
    return tuple(BucketEntry(p.group_index, p.padded_numel,
                             tuple(ParamEntry(f"p{i}", tuple(s.shape), s.offset, s.numel)
                                   for i, s in zip(p.param_indices, p.slots, strict=True)))
                 for p in plans)


@pytest.mark.parametrize("old_world,new_world,new_parts", [(2, 4, 4), (4, 2, 2), (3, 5, 5), (2, 3, 1), (1, 4, 4)])
def test_copies_fill_every_owned_element_exactly_once_from_the_right_value(old_world: int, new_world: int,
                                                                          new_parts: int) -> None:
    rng = random.Random(old_world * 10 + new_world)
    shapes = [(rng.randint(1, 9), rng.randint(1, 7)) for _ in range(11)]
    old = _layout(shapes, 40, old_world)
    new = _layout(shapes, 25, new_world)  # other bucket boundaries too
    # ground truth: element j of parameter i has the value i * 1000 + j
    saved = []
    for r in range(old_world):
        chunks = [torch.full((b.chunk_numel(old_world),), -1.0) for b in old]
        for pc in chunk_pieces(old, old_world, r):
            i = int(pc.name[1:])
            chunks[pc.bucket][pc.pos:pc.pos + pc.length] = i * 1000 + torch.arange(pc.start, pc.start + pc.length)
        saved.append(chunks)
    for rank in range(new_parts):
        owned = chunk_pieces(new, new_parts, rank)
        copies = plan_copies(old, old_world, owned)
        dst = [torch.full((b.padded_numel // new_parts,), -1.0) for b in new]
        hits = [torch.zeros(b.padded_numel // new_parts) for b in new]
        for c in copies:
            dst[c.dst_bucket][c.dst_pos:c.dst_pos + c.length] = saved[c.src_rank][c.src_bucket][c.src_pos:c.src_pos + c.length]
            hits[c.dst_bucket][c.dst_pos:c.dst_pos + c.length] += 1
        for pc in owned:
            i = int(pc.name[1:])
            want = i * 1000 + torch.arange(pc.start, pc.start + pc.length, dtype=torch.float32)
            assert torch.equal(dst[pc.bucket][pc.pos:pc.pos + pc.length], want)
            assert torch.equal(hits[pc.bucket][pc.pos:pc.pos + pc.length], torch.ones(pc.length))
        if new_parts == new_world > 1 and old_world == 1:
            assert ranks_to_read(copies) == [0]


def test_a_rank_reads_only_the_files_overlapping_its_range() -> None:
    layout = _layout([(8, 8)], 1000, 4)  # one bucket of 64 elements, chunks of 16
    assert round_up(64, 4) == layout[0].padded_numel
    two = _layout([(8, 8)], 1000, 2)
    assert ranks_to_read(plan_copies(layout, 4, chunk_pieces(two, 2, 0))) == [0, 1]
    assert ranks_to_read(plan_copies(layout, 4, chunk_pieces(two, 2, 1))) == [2, 3]


def test_manifest_json_round_trip() -> None:
    m = Manifest(world_size=2, stage=1, dtype="fp32", zerorun_version="0.1.0",
                 buckets=_layout([(3, 4), (5,)], 100, 2), global_steps=7, aliases={"b.weight": "a.weight"})
    assert Manifest.from_json(m.to_json()) == m


def test_layout_differences_name_missing_extra_and_reshaped() -> None:
    diffs = layout_differences({"a": (2, 3), "b": (4,)}, {"a": (3, 2), "c": (1,)})
    assert diffs == ["a: checkpoint shape [2, 3], model shape [3, 2]",
                     "b [4] is in the checkpoint but not in the model",
                     "c [1] is in the model but not in the checkpoint"]
    many = layout_differences({f"x{i}": (1,) for i in range(9)}, {})
    assert len(many) == 6 and many[-1] == "... and 4 more"


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    write_text(tmp_path / "latest", "one")
    write_text(tmp_path / "latest", "two")
    assert [p.name for p in tmp_path.iterdir()] == ["latest"] and (tmp_path / "latest").read_text() == "two"


class Wider(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.fc2 = torch.nn.Linear(15, 15, bias=False)
        self.extra = torch.nn.Linear(2, 2)


def test_bad_inputs_name_the_problem(tmp_path: Path) -> None:
    import zerorun

    engine = build(CASES[1], 1)
    train(engine, 0, 1, 0, 1)
    engine.save_checkpoint(str(tmp_path), tag="t1")
    engine.save_checkpoint(str(tmp_path), tag="t2", save_latest=False)
    assert list_tags(tmp_path) == ["t1", "t2"] and (tmp_path / "latest").read_text() == "t1"

    with pytest.raises(CheckpointError) as e:
        engine.load_checkpoint(str(tmp_path), tag="t3")
    assert "'t3' does not exist" in e.value.message and "complete tags: t1, t2" in e.value.message

    with pytest.warns(UserWarning, match=r"no 'latest' file .* nothing loaded \(complete tags: none\)"):
        assert engine.load_checkpoint(str(tmp_path / "nowhere")) == (None, None)  # DeepSpeed's first-start answer

    other, _, _, _ = zerorun.initialize(model=Wider(), config=CASES[1].config(1))
    with pytest.raises(CheckpointError) as e:
        other.load_checkpoint(str(tmp_path))
    msg = e.value.message
    assert "saved from a different model" in msg
    assert "fc2.bias [15] is in the checkpoint but not in the model" in msg
    assert "extra.weight [2, 2] is in the model but not in the checkpoint" in msg
    assert e.value.hint

    with pytest.raises(CheckpointError, match="not a plain directory name"):
        engine.save_checkpoint(str(tmp_path), tag="../escape")


def test_an_unwritable_save_dir_fails_with_a_hint_and_keeps_latest(tmp_path: Path) -> None:
    engine = build(CASES[2], 1)
    engine.save_checkpoint(str(tmp_path / "ok"), tag="first")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CheckpointError) as e:
        engine.save_checkpoint(str(blocker / "ckpt"))
    assert e.value.message.startswith("[rank 0] checkpoint save failed while creating")
    assert "Not a directory" in e.value.message and "untouched" in e.value.hint
    assert (tmp_path / "ok" / "latest").read_text() == "first"


def test_non_strict_load_skips_names_missing_on_either_side(tmp_path: Path) -> None:
    import zerorun

    engine = build(CASES[1], 1)
    train(engine, 0, 1, 0, 1)
    engine.save_checkpoint(str(tmp_path))
    other, _, _, _ = zerorun.initialize(model=Wider(), config=CASES[1].config(1))
    before = other.module.extra.weight.detach().clone()
    other.load_checkpoint(str(tmp_path), load_module_strict=False)
    assert torch.equal(other.module.fc1.weight, engine.module.fc1.weight)
    assert torch.equal(other.module.fc2.weight, engine.module.fc2.weight)
    assert torch.equal(other.module.extra.weight, before)  # not in the checkpoint: kept
