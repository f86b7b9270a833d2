"""The one conftest: the helper modules beside it (the spawn harness, the launch helpers, the
launcher's fixtures) import by name from every test folder, and from the processes tests spawn."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# One thread per process, in the test workers and in what they start (a child given an environment of
# its own sets its own): 4 workers share 2 cores, and an OpenMP thread spins a while after its work,
# on a core another test needs (the dry GPU check: a third more CPU under load for the same work).
os.environ.setdefault("OMP_NUM_THREADS", "1")

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_left_behind() -> Iterator[None]:
    """Every test module starts without a default process group: in-process engines (world 1) create
    one and keep it, and a simulated world (``zerorun.simulate.world``) needs a process without one."""
    yield
    dist = sys.modules.get("torch.distributed")  # never imported here: no group to tear down, no import to pay
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An engine built in this process is world size 1: no launcher variables, its group torn down after."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ZERORUN_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()


# How the test workers share the suite (``-n 4 --dist loadscope --no-loadscope-reorder``): a module is one
# unit of work, so a module-scoped fixture (a spawned world that trains every case once, a saved model and
# its references) runs once, not once on every worker that draws one of its tests. Each worker takes the
# next module as it frees up, in this order: the longest first (in a shared run, 50-300 s each), so they run
# beside short ones from the start and the workers end the run together; the rest as collected.
LONG_FIRST = ("tests/scripts/test_ds_scripts_trl.py", "tests/simulate/test_simulate.py",
              "tests/scripts/test_ds_scripts_hf.py", "tests/scripts/test_ds_scripts.py",
              "tests/engine/test_engine_exit.py", "tests/bench/test_gpu_check.py",
              "tests/launcher/test_launcher_multinode.py",
              "tests/autotune/test_autotune_e2e.py", "tests/engine/test_engine_stage3.py",
              "tests/engine/test_engine_parity.py", "tests/scripts/test_ds_bf16_master_weight.py",
              "tests/launcher/test_launcher_stall.py", "tests/first_hour/test_install.py",
              "tests/engine/test_engine_compile.py", "tests/launcher/test_launcher_elastic.py",
              "tests/launcher/test_launcher_openmpi.py", "tests/bench/test_gpu_peers.py",
              "tests/engine/test_engine_examples.py", "tests/launcher/test_launcher_restart.py")


def _long_rank(item: pytest.Item) -> int:
    return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_long_rank)  # stable: the order within each module is kept


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "netns: needs Linux network namespaces (root, iproute2, sshd); skips with the reason")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many network-namespace tests ran and how many skipped (their reasons are in -ra's list)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in counts:
        for report in terminalreporter.stats.get(outcome, []):
            if "netns" in getattr(report, "keywords", {}) and (report.when == "call" or outcome == "skipped"):
                counts[outcome] += 1
    if any(counts.values()):
        terminalreporter.write_line(f"network-namespace tests: {counts['passed'] + counts['failed']} ran "
                                    f"({counts['failed']} failed), {counts['skipped']} skipped")
