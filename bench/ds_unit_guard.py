"""A pytest plugin for ``bench/ds_unit.py``: one hung or failed DeepSpeed test costs that test alone.

DeepSpeed's harness (``tests/unit/common.py``) runs each distributed test in a pool of rank
processes. When a rank raises while its peer waits in a collective, the harness's teardown asks the
pool to tear down the process group and waits on the peer: that wait lasts as long as the backend's
timeout (30 minutes); when a test outlives ``DS_UNITTEST_TIMEOUT`` the harness calls ``pytest.exit``,
ending the whole file. Both make a measurement of many files impossible on a small machine.

Loaded with ``-p ds_unit_guard`` (``bench/`` on ``PYTHONPATH``), it wraps the harness's daemonic
launcher: a passing or skipped test runs exactly as before (same pool, same graceful teardown); a
failure or a timeout (pytest-timeout's ``--timeout`` alarm or the harness's own) terminates that
test's pool and fails that test only, and a rank's exception comes back as a plain ``RuntimeError``
carrying its text. The same plugin runs for DeepSpeed and for zerorun, so both
sides of the table are measured under one harness.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import traceback
from typing import Any

import pytest

_PATCHED = False


def _terminate(owner: Any, pool: Any) -> None:
    """Kill a test's rank processes at once and forget the pool if the harness cached it."""
    pool.terminate()
    pool.join()
    for key, cached in list(owner._pool_cache.items()):
        if cached is pool:
            del owner._pool_cache[key]


def _run_rank(test: Any, *args: Any) -> Any:
    """One rank of a test (in a pool process): any failure comes back as a plain, picklable ``RuntimeError``.

    pytest's own outcomes (``Failed`` from ``pytest.raises``' "DID NOT RAISE", ``pytest.fail``) do not
    unpickle in the pool's result thread, which then dies and leaves the test waiting for ever.
    """
    try:
        return test._dist_run(*args)
    except BaseException as e:  # noqa: BLE001 - whatever a rank raised, the test shows it and fails
        text = "".join(traceback.format_exception(e)[-12:])
        raise RuntimeError(f"{type(e).__name__}: {e}\n{text}") from None


def _guarded_launch(self: Any, num_procs: int, init_method: Any) -> None:
    """The harness's daemonic launch, but a failure or a hang terminates the pool instead of waiting on it."""
    common = sys.modules["unit.common"]
    master_port = None
    if self.reuse_dist_env:
        if num_procs not in self._pool_cache:
            self._pool_cache[num_procs] = mp.Pool(processes=num_procs)
            master_port = common.get_master_port()
        pool = self._pool_cache[num_procs]
    else:
        pool = mp.Pool(processes=num_procs)
        master_port = common.get_master_port()
    args = [(local_rank, num_procs, master_port, init_method) for local_rank in range(num_procs)]
    pending = pool.starmap_async(_run_rank, [(self, *a) for a in args])
    try:
        skip_msgs = pending.get(self.exec_timeout)
    except mp.TimeoutError:
        _terminate(self, pool)
        pytest.fail(f"hung: no result within {self.exec_timeout} s (its rank processes were terminated)",
                    pytrace=False)
    except BaseException:
        _terminate(self, pool)
        raise
    self._close_pool(pool, num_procs)
    if any(skip_msgs):
        assert len(set(skip_msgs)) == 1, "Multiple different skip messages received"
        pytest.skip(skip_msgs[0])


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Patch DeepSpeed's harness once, after the test files have imported it."""
    global _PATCHED
    common = sys.modules.get("unit.common")
    if _PATCHED or common is None:
        return
    common.DistributedExec._launch_daemonic_procs = _guarded_launch
    _PATCHED = True
