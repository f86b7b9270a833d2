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
