"""Optimizer offload (cpu, nvme) trains exactly as no offload; nvme swap files are checked and cleaned up.

This machine has no GPU, so the compute device is the CPU and offload to "cpu" is a
placement whose copies are same-device no-ops: the code path (host masters, gradient
shards copied with ``non_blocking``, publish copying the masters back, the nvme swap
round trip) runs here, but pinned memory and real host<->GPU copies are exercised only
on a GPU. Parity is exact (``torch.equal``): offload changes where the step runs, not
what it computes. The host step gets torch's fused CPU kernel by default
(zerorun.engine.training.host_kernel), so the reference without offload is built with
``fused: true`` too: the same kernel on both sides, and the comparison stays exact
(tests/engine/offload/test_host_kernel.py bounds fused against foreach).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.checkpoint.test_checkpoint_cases import Case, build, snapshot, train
from zerorun.engine.errors import EngineError
from zerorun.engine.offload import OffloadError, OffloadPolicy
from zerorun.engine.offload.swapper import check_space

STEPS = 5
PLACEMENTS = ("none", "cpu", "nvme")
CASES = [Case(1), Case(2, overlap=True), Case(3), Case(2, "fp16")]
# the offload's copies under the deferred-copy stand-in (zerorun.engine.offload.copy_checks): each
# queued host<->device copy lands, or frees its host side, only at its fence; one case, both devices
DEFERRED_CASE = CASES[1]


def _offload(kind: str, root: str) -> dict[str, Any] | None:
    if kind == "none":
        return None
    if kind.startswith("cpu"):
        return {"device": "cpu", "pin_memory": True}
    return {"device": "nvme", "nvme_path": root, "buffer_count": 2, "pin_memory": kind.endswith("deferred")}


def _engine(case: Case, world: int, kind: str, root: str) -> Any:
    import zerorun
    from tests.engine.test_engine_cases import make_model

    cfg = case.config(world, offload=_offload(kind, root))
    if kind == "none":  # the kernel the host step gets by default (see the module docstring)
        cfg["optimizer"]["params"]["fused"] = True
    engine, _, _, _ = zerorun.initialize(model=make_model(), config=cfg)
    return engine


def _deferred(case: Case, rank: int, world: int, root: str) -> dict[str, dict[str, Any]]:
    from zerorun.engine.offload.copy_checks import CHECK_ENV, DeferredTransfers

    out = {}
    os.environ[CHECK_ENV] = "deferred"
    try:
        for kind in ("cpu-deferred", "nvme-deferred"):
            engine = _engine(case, world, kind, os.path.join(root, f"swap{rank}-{kind}"))
            stand_in = isinstance(engine.parts.masters.copies, DeferredTransfers) and engine.parts.masters.copies.pins
            out[f"{case.name}/{kind}"] = {"losses": train(engine, rank, world, 0, STEPS), **snapshot(engine),
                                         "stand_in": stand_in}
            if kind.startswith("nvme"):
                engine.parts.masters.close()
    finally:
        del os.environ[CHECK_ENV]
    return out


def _parity(rank: int, world: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = _deferred(DEFERRED_CASE, rank, world, root)
    for case in CASES:
        for kind in PLACEMENTS:
            engine = _engine(case, world, kind, os.path.join(root, f"swap{rank}"))
            losses = train(engine, rank, world, 0, STEPS)
            out[f"{case.name}/{kind}"] = {"losses": losses, **snapshot(engine),
                                         "memory": engine.memory_breakdown(), "buckets": len(engine.parts.buckets)}
            if kind == "nvme":
                swap = Path(engine.parts.masters.swapper.dir)
                out[f"{case.name}/{kind}"]["swap_files"] = sorted(p.name for p in swap.iterdir())
                # a checkpoint of the swapped-out state loads into an engine without offload
                engine.save_checkpoint(os.path.join(root, f"ckpt-{case.name}"))
                plain = build(case, world, seed=3)
                plain.load_checkpoint(os.path.join(root, f"ckpt-{case.name}"))
                train(plain, rank, world, STEPS, 1)
                train(engine, rank, world, STEPS, 1)
                out[f"{case.name}/after-load"] = {"plain": _masters(plain), "nvme": _masters(engine)}
                engine.parts.masters.close()
                out[f"{case.name}/{kind}"]["swap_exists_after_close"] = swap.exists()
    return out


def _masters(engine: Any) -> list[torch.Tensor]:
    """The fp32 master shards (read back from the swap files for nvme)."""
    from zerorun.engine.offload.resident import resident

    with resident(engine.parts.masters):
        return [m.detach().clone() for m in engine.parts.masters.masters]


@pytest.fixture(scope="module")
def parity() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as root:
        return run_distributed(_parity, 2, root, timeout=240)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("kind", ["cpu", "nvme"])
def test_offload_trains_exactly_as_no_offload(parity: list[dict[str, Any]], case: Case, kind: str) -> None:
    for rank, r in enumerate(parity):
        ref, got = r[f"{case.name}/none"], r[f"{case.name}/{kind}"]
        assert got["losses"] == ref["losses"], f"[rank {rank}] {case.name} {kind}"
        assert got["global_steps"] == STEPS and got["loss_scale"] == ref["loss_scale"]
        for n, p in ref["params"].items():
            assert torch.equal(got["params"][n], p), f"[rank {rank}] {case.name} {kind}: {n}"


@pytest.mark.parametrize("kind", ["cpu-deferred", "nvme-deferred"])
def test_offload_trains_exactly_under_the_deferred_copy_stand_in(parity: list[dict[str, Any]], kind: str) -> None:
    case = DEFERRED_CASE
    for rank, r in enumerate(parity):
        ref, got = r[f"{case.name}/none"], r[f"{case.name}/{kind}"]
        assert got["stand_in"], "the stand-in did not pin: the copies ran blocking"
        assert got["losses"] == ref["losses"], f"[rank {rank}] {case.name} {kind}"
        for n, p in ref["params"].items():
            assert torch.equal(got["params"][n], p), f"[rank {rank}] {case.name} {kind}: {n}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nvme_keeps_nothing_resident_between_steps(parity: list[dict[str, Any]], case: Case) -> None:
    for r in parity:
        nvme, cpu = r[f"{case.name}/nvme"], r[f"{case.name}/cpu"]
        assert nvme["memory"]["master_params"] == 0 < cpu["memory"]["master_params"]
        # only Adam's scalar step counts stay in memory (one fp32 per bucket)
        assert nvme["memory"]["optimizer_states"] == 4 * nvme["buckets"]
        assert cpu["memory"]["optimizer_states"] > 2 * cpu["memory"]["master_params"]
        names = nvme["swap_files"]
        assert "b0.master" in names and "b0.exp_avg" in names and "b0.exp_avg_sq" in names
        assert not nvme["swap_exists_after_close"]
        # one more step after a save/load round trip: the masters of both engines agree exactly
        after = r[f"{case.name}/after-load"]
        for i, (a, b) in enumerate(zip(after["plain"], after["nvme"], strict=True)):
            assert torch.equal(a, b), f"{case.name}: master of bucket {i}"


def test_pinning_needs_cuda() -> None:
    policy = OffloadPolicy("cpu", pin_memory=True)
    assert policy.pins == torch.cuda.is_available()
    host = policy.host_copy(torch.ones(3, dtype=torch.bfloat16))
    assert host.dtype == torch.float32 and host.device.type == "cpu"


def test_nvme_path_that_cannot_be_a_directory_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(EngineError) as e:  # initialize re-raises it with the rank prefix
        _engine(Case(2), 1, "nvme", str(blocker / "swap"))
    assert e.value.message.startswith("[rank 0] offload_optimizer.nvme_path")
    assert "is not a writable directory" in e.value.message and "nvme_path" in e.value.hint


def test_not_enough_free_space_is_an_error_naming_both_sizes(tmp_path: Path) -> None:
    import shutil

    free = shutil.disk_usage(tmp_path).free
    check_space(tmp_path, 1024)  # fits
    with pytest.raises(OffloadError) as e:
        check_space(tmp_path, free + 2**40)  # a TiB more than the disk has
    assert "MiB free" in e.value.message and str(tmp_path) in e.value.message
    assert "device: cpu" in e.value.hint


CHILD = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
from tests.engine.checkpoint.test_checkpoint_cases import Case, train
from tests.engine.offload.test_offload import _engine
engine = _engine(Case(2), 1, "nvme", sys.argv[1])
train(engine, 0, 1, 0, 2)
print(engine.parts.masters.swapper.dir, flush=True)
if sys.argv[2] == "fail":
    raise RuntimeError("the training script failed")
"""


def test_swap_files_are_removed_on_exit_and_on_failure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    children = {}
    for how in ("exit", "fail"):  # both at once: each is a fresh interpreter importing torch
        (tmp_path / how).mkdir()
        children[how] = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / how), how], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for how, child in children.items():
        out, err = child.communicate(timeout=120)
        assert child.returncode == (1 if how == "fail" else 0), err
        if how == "fail":
            assert "the training script failed" in err
        swap = Path(out.strip().splitlines()[-1])
        assert swap.parent == tmp_path / how and not swap.exists()
        assert list((tmp_path / how).iterdir()) == []
