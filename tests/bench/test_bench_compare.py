"""bench/compare.py's A/B: two arms' environments and the table of their ratios to DDP."""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _compare():
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arm_a_is_the_other_checkout_and_settings_arm_b_this_one(tmp_path: Path) -> None:
    compare = _compare()
    args = argparse.Namespace(ab_path=str(tmp_path), ab_env=["MALLOC_TRIM_THRESHOLD_=131072"])
    (a, env_a), (b, env_b) = compare.ab_arms(args)
    assert (a, b, env_b) == ("A", "B", {})
    assert env_a["MALLOC_TRIM_THRESHOLD_"] == "131072"
    assert env_a["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path.resolve())


def test_the_ab_table_gives_medians_spreads_and_their_ratio() -> None:
    compare = _compare()
    table = compare.ab_table({"zerorun-z2": {"A": [1.0, 1.2, 1.1], "B": [0.9, 1.32, 1.21]}, "zerorun-z3": {"A": [2.0]}},
                             {"zerorun-z2": {"A": [0.5, 0.7, 0.6], "B": [0.4]}, "torch-ddp": {"B": [0.3]}})
    lines = table.splitlines()
    assert lines[2] == ("| zerorun-z2 | 1.100 (1.000-1.200) | 1.210 (0.900-1.320) | 1.100 | 0.600 (0.500-0.700) "
                        "| 0.400 (0.400-0.400) |")
    assert lines[3] == "| zerorun-z3 | 2.000 (2.000-2.000) | - | - | - | - |"
    assert lines[4] == "| torch-ddp | - | - | - | - | 0.300 (0.300-0.300) |"  # DDP's own step time, per arm
