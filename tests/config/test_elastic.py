"""``zerorun.config.elastic`` against DeepSpeed's own ``compute_elastic_config`` answers.

The fixture was made by ``bench/elastic_parity_fixture.py`` with the peers' interpreter
(DeepSpeed 0.19.8 installed) from DeepSpeed's source; every (block, world) answer - batch,
valid worlds, micro batch, or that it fails - must match. DeepSpeed 0.19.8 itself has no
``deepspeed/elasticity`` any more and refuses the block (the fixture's ``installed``), so the
answers are those of the last source that has it (the fixture's ``rev``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerorun.config.elastic import ElasticError, compute, nearest

FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "elastic_parity.json").read_text())
KINDS = {"ElasticityIncompatibleWorldSize": {"world"}, "ElasticityConfigError": {"config"},
         "ElasticityError": {"config"}, "ValueError": {"value"}, "TypeError": {"world", "value"},
         "AssertionError": {"value"}}
"""DeepSpeed's exception -> ours. TypeError: DeepSpeed tests ``world in None`` when no candidate had a valid world."""


def _ours(block: dict, world: int) -> dict:
    try:
        plan = compute(block, world or None)
    except ElasticError as err:
        return {"error": err.kind}
    return {"batch": plan.train_batch_size, "worlds": list(plan.valid_worlds), "micro": plan.micro_batch}


def test_parity_with_deepspeed_over_the_grid() -> None:
    assert len(FIXTURE["cases"]) > 200
    mismatches = []
    for case in FIXTURE["cases"]:
        for world, theirs in case["answers"].items():
            ours = _ours(case["block"], int(world))
            same = (ours.get("error") in KINDS[theirs["error"]]) if "error" in theirs else ours == theirs
            if not same:
                mismatches.append((case["block"], world, theirs, ours))
    assert not mismatches, (len(mismatches), mismatches[:3])


def test_the_fixture_names_the_release_it_was_made_beside() -> None:
    installed = FIXTURE["installed"]
    assert installed["version"] == "0.19.8" and not installed["has_elasticity_package"]
    assert installed["config_answer"]["error"] == "DeepSpeedConfigError"


def test_v02_without_a_world_needs_one() -> None:
    with pytest.raises(ElasticError, match="needs the world size"):
        compute({"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2], "version": 0.2})


def test_the_plan_for_a_world_multiplies_out() -> None:
    block = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6], "version": 0.1}
    for world in compute(block).valid_worlds[:12]:
        plan = compute(block, world)
        assert plan.micro_batch * plan.gradient_accumulation_steps * world == plan.train_batch_size


def test_nearest_names_the_neighbours() -> None:
    assert nearest([1, 2, 4, 8], 3) == "2 or 4"
    assert nearest([4, 8], 2) == "4"


ELASTIC = {"elasticity": {"enabled": True, "max_train_batch_size": 24, "micro_batch_sizes": [2, 4], "version": 0.1}}


def test_the_config_takes_its_batch_from_the_block_at_each_world() -> None:
    from zerorun.config import load_config

    at = {world: load_config(ELASTIC, world_size=world) for world in (1, 2, 3, 6)}
    assert {cfg.train_batch_size for cfg in at.values()} == {24}
    assert [(c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) for c in at.values()] == [
        (4, 6), (4, 3), (4, 2), (4, 1)]


def test_batch_keys_beside_the_block_are_refused_unless_ignored() -> None:
    from zerorun.config import load_config
    from zerorun.config.problems import ConfigError, ConfigWarning

    with pytest.raises(ConfigError, match="cannot be set with an enabled elasticity block"):
        load_config({**ELASTIC, "train_batch_size": 8}, world_size=2)
    ignored = {"elasticity": {**ELASTIC["elasticity"], "ignore_non_elastic_batch_info": True}, "train_batch_size": 8}
    with pytest.warns(ConfigWarning, match="overridden by the elasticity block"):
        assert load_config(ignored, world_size=2).train_batch_size == 24
    with pytest.raises(ConfigError, match=r"world size 5 is not one of .*; run at 4 or 6"):
        load_config(ELASTIC, world_size=5)


FIXED = {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}  # world 3


def test_a_restart_at_another_world_keeps_the_global_batch() -> None:
    from zerorun.config import load_config
    from zerorun.config.problems import ConfigError

    with pytest.raises(ConfigError, match=r"24\) != .* world_size \(2\)"):  # without the flag: the triple is checked
        load_config(FIXED, world_size=2)
    cfg = load_config(FIXED, world_size=2, keep_global_batch=True)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (24, 4, 3)
    with pytest.raises(ConfigError, match="cannot be kept at world 4; restart at 3 or 6 ranks"):
        load_config(FIXED, world_size=4, keep_global_batch=True)
