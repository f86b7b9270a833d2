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
