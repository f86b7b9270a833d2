"""``add_config_arguments`` next to the flags DeepSpeed example scripts declare themselves."""

from __future__ import annotations

import argparse

from zerorun.engine.api import add_config_arguments


def test_script_that_declares_local_rank_keeps_it() -> None:
    """The shape of 19 of 20 DeepSpeed examples: their own --local_rank, then add_config_arguments."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser = add_config_arguments(parser)
    ns = parser.parse_args(["--local_rank=1", "--deepspeed", "--deepspeed_config", "ds.json"])
    assert (ns.local_rank, ns.deepspeed, ns.deepspeed_config) == (1, True, "ds.json")
    assert parser.parse_args([]).local_rank == -1  # the script's default, not ours


def test_script_that_declares_local_rank_after_the_helper_keeps_it() -> None:
    """DeepSpeed's helper adds no --local_rank, so some scripts declare theirs afterwards."""
    parser = add_config_arguments(argparse.ArgumentParser())
    parser.add_argument("--local_rank", type=int, default=-1)
    ns = parser.parse_args(["--local_rank=1", "--deepspeed_config", "ds.json"])
    assert (ns.local_rank, ns.deepspeed_config) == (1, "ds.json")
    assert parser.parse_args([]).local_rank == -1


def test_script_with_its_own_config_flag_keeps_it() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", help="the model's config")
    add_config_arguments(parser)
    ns = parser.parse_args(["--config", "model.json", "--deepspeed_config", "ds.json"])
    assert (ns.config, ns.deepspeed_config) == ("model.json", "ds.json")


def test_bare_parser_gets_every_flag_including_deprecated_names(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    parser = add_config_arguments(argparse.ArgumentParser())
    ns = parser.parse_args(["--deepscale", "--deepscale_config", "old.json"])
    assert (ns.deepscale, ns.deepscale_config, ns.local_rank, ns.deepspeed_config) == (True, "old.json", 3, None)
    assert parser.parse_args(["--local-rank", "2", "--config", "z.yaml"]).local_rank == 2
