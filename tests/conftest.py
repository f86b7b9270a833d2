"""The one conftest: the helper modules beside it (the spawn harness, the launch helpers, the
launcher's fixtures) import by name from every test folder, and from the processes tests spawn."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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


# The longest tests (real training scripts, a clean install, the exit stress rounds, the dry GPU checks:
# tens of seconds each) start first, so that the test workers end the run on short ones together rather
# than one worker finishing a long test alone (the order within each group is kept).
LONG_FIRST = ("tests/scripts/", "tests/engine/test_engine_exit.py", "tests/autotune/test_autotune_e2e.py",
              "tests/first_hour/test_install.py", "tests/bench/", "tests/launcher/test_launcher_elastic.py",
              "tests/launcher/test_launcher_stall.py", "tests/compat/test_ds_command.py",
              "tests/simulate/test_simulate.py", "tests/engine/test_engine_compile.py",
              "tests/launcher/test_launcher_restart.py", "tests/engine/checkpoint/test_convert_memory.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


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
