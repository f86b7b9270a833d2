"""The physical figures of ``engine.memory_breakdown()``: present, moved by a real allocation, reset.

One process, world 1. The allocation is 64 MiB of ones (written, so the pages are resident),
made between ``reset_memory_peak()`` and the read: the high-water mark must rise by about
that much, the resident set fall back once it is freed, and a second reset bring the peak
down to the resident set again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

import zerorun
from zerorun.engine.metrics import format_memory, model_state_bytes
from zerorun.engine.physical_memory import HOST_KEYS

MiB = 2**20
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="the host figures need Linux /proc")


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ZERORUN_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    eng, _, _, _ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=config)
    yield eng
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_host_peak_moves_with_an_allocation_and_resets(engine) -> None:
    assert engine.reset_memory_peak() is True
    before = engine.memory_breakdown()
    assert set(HOST_KEYS) <= set(before)
    assert before["host_baseline_rss"] > 0 and 0 < before["host_rss"] <= before["host_peak_rss"]
    big = torch.ones(64 * MiB // 4)  # written: every page resident
    held = engine.memory_breakdown()
    del big
    after = engine.memory_breakdown()
    assert held["host_rss"] - before["host_rss"] >= 60 * MiB
    assert after["host_peak_rss"] - before["host_peak_rss"] >= 60 * MiB  # the peak remembers it
    assert after["host_rss"] < after["host_peak_rss"] - 48 * MiB  # freed: the resident set fell back
    engine.reset_memory_peak()
    reset = engine.memory_breakdown()
    assert reset["host_peak_rss"] < after["host_peak_rss"] - 48 * MiB  # a new window starts now


def test_the_bookkeeping_total_leaves_the_physical_keys_out(engine) -> None:
    breakdown = engine.memory_breakdown()
    bookkeeping = {k: v for k, v in breakdown.items() if k not in HOST_KEYS}
    assert model_state_bytes(breakdown) == sum(bookkeeping.values()) > 0
    line = format_memory(breakdown)
    assert "host_peak_rss" in line and line.index("total") < line.index("host_rss")


_LAZY_CHECK = """
import sys, torch
from zerorun.engine import physical_memory as pm
assert "torch._dynamo" not in sys.modules
base = pm.physical_figures(torch.device("cpu"))["host_baseline_rss"]
grown = pm.load_optimizer_runtime()
after = pm.physical_figures(torch.device("cpu"))["host_baseline_rss"]
print(grown, after - base, pm.load_optimizer_runtime())
"""


def test_torch_optims_lazy_libraries_count_in_the_baseline_not_in_a_peak() -> None:
    """A fresh interpreter: importing them grows the resident set by tens of MiB, and exactly that
    growth joins the baseline, once."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LAZY_CHECK], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    grown, moved, again = (int(v) for v in out.stdout.split())
    assert grown > 10 * MiB and moved == grown and again == 0
