"""The one conftest: the helper modules beside it (the spawn harness, the launch helpers, the
launcher's fixtures) import by name from every test folder, and from the processes tests spawn."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
