"""An inherited CUDA_VISIBLE_DEVICES is the local node's slots.

No GPU exists here: NVML's count is replaced by a stand-in of 8 GPUs (``launcher.main.gpu_count``),
as a node where a scheduler handed this job GPUs 2 and 5 of 8 would report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.plan.devices import local_gpus, visible_devices
from launcher.plan.filters import NodeSlots
from launcher.plan.hostfile import Host
from launcher.plan.launch_plan import LaunchPlan, build_plan, rank_env


@pytest.mark.parametrize(("value", "ids"), [
    (None, None), ("", ()), ("-1", ()), ("2,5", ("2", "5")), ("3, 1", ("3", "1")), ("0,-1,2", ("0",)),
    ("GPU-8f1c,MIG-2a", ("GPU-8f1c", "MIG-2a")),
])
def test_visible_devices_reads_cudas_list(value: str | None, ids: tuple[str, ...] | None) -> None:
    assert visible_devices({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == ids


def test_local_gpus_are_the_visible_ones_else_all() -> None:
    assert local_gpus({}, 4) == ("0", "1", "2", "3")
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}, 8) == ("2", "5")
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}, 0) == ()  # no GPU at all: CPU ranks


def _plan(visible: tuple[str, ...], slots: tuple[int, ...]) -> LaunchPlan:
    return build_plan((NodeSlots(Host("localhost", 2), slots),), command=("t.py",), job_id="j", cwd="/",
                      python="python", local=True, visible_devices=visible)


def test_ranks_get_the_visible_ids_not_their_slot_numbers() -> None:
    plan = _plan(("2", "5"), (0, 1))
    assert [rank_env(plan, 0, r, True)["CUDA_VISIBLE_DEVICES"] for r in range(2)] == ["2,5", "2,5"]
    assert rank_env(_plan(("2", "5"), (1,)), 0, 0, True)["CUDA_VISIBLE_DEVICES"] == "5"  # --include localhost:1
    assert rank_env(_plan((), (0, 1)), 0, 0, True)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert LaunchPlan.from_dict(plan.to_dict()) == plan  # the agent gets the same ids


def test_dry_run_counts_and_names_the_inherited_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from launcher import main as launcher_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher_main, "gpu_count", lambda: 8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert launcher_main.main(["--dry-run", "--json", "t.py"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 2 and out["nodes"][0]["devices"] == ["2", "5"]
    assert launcher_main.main(["--dry-run", "t.py"]) == 0
    assert "inherited CUDA_VISIBLE_DEVICES=2,5" in capsys.readouterr().out
    from launcher.errors import FilterError
    with pytest.raises(FilterError, match="CUDA_VISIBLE_DEVICES='2,5'"):
        launcher_main.main(["--num_gpus", "3", "--dry-run", "t.py"])
