"""With optimizer offload the device holds no gradient shard and no master (DESIGN.md, invariant 8).

No GPU here: the engine runs under the deferred-copy stand-in (``ZERORUN_CHECK_COPIES=deferred``,
zerorun.engine.offload.copy_checks), where the copier's pinned buffers are the host and every
other tensor stands for a device tensor, and a queued copy lands only at its fence. At every
gradient hook of a backward pass (and as it ends, before anything is waited for) every tensor
the engine's parts hold is listed, with the role it plays, and put on its side. At the backward
peak the device must hold the 16-bit parameters (stage 3: the gathered window, and the resting
shards unless ``offload_param``) and the reduce buckets in flight, nothing else of the model
state, at stages 1, 2 and 3, with cpu and nvme. The same listing with the gradient sums left on
the device (the design before: shards copied down at the step) shows them there, so the check
can fail. A second test holds the overlap: a unit's reduced chunk is on its way to the host
while the next unit's backward runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import zerorun
from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.offload import copy_checks
from zerorun.engine.offload.copies import Transfers

LAYERS, WIDTH = 4, 16
pytestmark = pytest.mark.usefixtures("world_of_one")  # tests/conftest.py

# reduce_bucket_size: a bucket per layer (stages 1-2); stage 3 gathers every unit (no persistent ones)
_ZERO = {"reduce_bucket_size": WIDTH * WIDTH + WIDTH, "stage3_param_persistence_threshold": 0}


def _config(stage: int, device: str, root: Path, bf16: bool = True, **zero: Any) -> dict[str, Any]:
    off: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        off |= {"nvme_path": str(root / "swap"), "buffer_count": 2}
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                           "steps_per_print": 10**6, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                           "zero_optimization": {"stage": stage, "offload_optimizer": off, **_ZERO, **zero}}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


# ---- the listing ------------------------------------------------------------------------------
_MACHINERY = (nn.Module, torch.optim.Optimizer, Collectives, Transfers, copy_checks.CopyStream)


def _walk(obj: object, path: str, seen: set[int], out: list[tuple[str, torch.Tensor]]) -> None:
    """Every tensor reachable from ``obj`` through containers and attributes (not modules, optimizers,
    collectives or copiers: the parameters and the state are listed from the engine's own handles)."""
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    if id(obj) in seen or isinstance(obj, _MACHINERY) or callable(obj) and not hasattr(obj, "__dict__"):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        items: Iterator[tuple[object, object]] = iter(obj.items())
    elif isinstance(obj, (list, tuple, deque)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("zerorun"):
        items = iter(vars(obj).items())
    else:
        return
    for k, v in items:
        _walk(v, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]", seen, out)


_ROLES = [("grad_sync.accum", "gradient shard"), ("grad_sync.free", "reduce buckets"),
          ("grad_sync.staging", "reduce buckets"), ("grad_sync.group", "reduce buckets"),
          ("grad_sync.grads", "full gradient"), ("grad_sync.views", "full gradient"),
          ("state:", "optimizer state"), ("masters.masters", "master"), ("masters.inner.masters", "master")]


def _role(path: str) -> str:
    """A tensor's role by where the engine holds it; an unknown place is named as it is (and fails the check)."""
    return next((role for prefix, role in _ROLES if path.startswith(prefix)), path)


def listing(engine: Any) -> dict[str, int]:
    """Bytes of model state on the (stand-in) device, by role."""
    stream = copy_checks.stream()
    parts = engine.parts
    found: list[tuple[str, torch.Tensor]] = []
    for name in ("buckets", "frozen", "masters", "grad_sync", "coordinator", "param_offload"):
        _walk(getattr(parts, name), name, set(), found)
    found += [(f"param:{n}", p) for n, p in engine.module.named_parameters()]
    masters = parts.masters.masters
    for m in masters:  # torch makes the state beside its master: its side is the master's
        found += [(f"state:{k}", m if v.numel() else v) for k, v in engine.optimizer.state.get(m, {}).items()
                  if torch.is_tensor(v)]
    device: dict[str, int] = {}
    counted: set[int] = set()
    storages_of_params = {id(p.untyped_storage()) for n, p in found if n.startswith("param:")}
    for path, t in found:
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or id(storage) in counted or stream.is_pinned(t):
            continue
        counted.add(id(storage))
        role = "parameters" if id(storage) in storages_of_params else _role(path)
        if path.startswith("buckets") and (path.endswith(".data") or path.endswith(".local")):
            role = "parameters"  # the bucket's flat 16-bit parameters (stage 3: window and resting shard)
        device[role] = device.get(role, 0) + storage.nbytes()
    return device


def _peak(engine: Any, micro_steps: int) -> dict[str, int]:
    """The listing at the fullest moment of the backward passes of ``micro_steps`` micro-steps."""
    sync = engine.parts.grad_sync
    seen: list[dict[str, int]] = []
    on_grad, finish = sync.on_grad_ready, sync.finish_backward

    def watched(*args: Any) -> None:
        on_grad(*args)
        seen.append(listing(engine))

    def finishing() -> None:
        seen.append(listing(engine))
        finish()

    sync.on_grad_ready, sync.finish_backward = watched, finishing
    g = torch.Generator().manual_seed(1)
    for _ in range(micro_steps):
        engine.backward(engine(torch.randn(4, WIDTH, generator=g).to(engine.precision.compute_dtype)).float().square().mean())
        engine.step()
    sync.on_grad_ready, sync.finish_backward = on_grad, finish
    return max(seen, key=lambda s: sum(s.values()))


OFFLOADS = [(1, "cpu", {}), (2, "cpu", {}), (3, "cpu", {}), (1, "nvme", {}), (2, "nvme", {}), (3, "nvme", {}),
            (3, "cpu", {"offload_param": {"device": "cpu", "pin_memory": True}})]


@pytest.mark.parametrize(("stage", "device", "zero"), OFFLOADS,
                         ids=[f"stage{s}-{d}{'-params' if z else ''}" for s, d, z in OFFLOADS])
def test_the_device_holds_parameters_and_buckets_in_flight_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                 stage: int, device: str, zero: dict) -> None:
    monkeypatch.setenv(copy_checks.CHECK_ENV, "deferred")
    engine, _, _, _ = zerorun.initialize(model=_model(), config=_config(stage, device, tmp_path, **zero))
    peak = _peak(engine, 4)  # two optimizer steps of two micro-steps: the state exists at the second
    accum = engine.parts.grad_sync.accum
    shards = sum(b.shard_numel for b in engine.parts.buckets)
    rest = listing(engine)  # between steps: stage 3 has nothing gathered
    if device == "nvme":
        engine.parts.masters.close()
    dist.destroy_process_group()
    assert set(peak) == {"parameters", "reduce buckets"}, peak
    assert accum.nbytes(host=False) == 0 and accum.nbytes(host=True) == 4 * shards
    assert set(rest) <= {"parameters", "reduce buckets"}, rest
    if zero:  # offload_param: of the parameters, the device keeps the gathered window only (empty at rest)
        assert "parameters" not in rest, rest
    else:  # the 16-bit parameters (stage 3: the resting shards)
        assert rest["parameters"] == 2 * shards, rest


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_listing_sees_gradients_left_on_the_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        stage: int) -> None:
    """The design before (no host home: the shard stays on the device until the step) fails the check."""
    from zerorun.engine import build

    monkeypatch.setenv(copy_checks.CHECK_ENV, "deferred")
    monkeypatch.setattr(build, "grad_home", lambda *args: None)
    engine, _, _, _ = zerorun.initialize(model=_model(), config=_config(stage, "cpu", tmp_path))
    peak = _peak(engine, 2)
    dist.destroy_process_group()
    assert {"gradient shard", "full gradient"} & set(peak), peak


def test_twin_flow_keeps_the_device_buckets_gradients_on_the_device(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv(copy_checks.CHECK_ENV, "deferred")
    cfg = _config(3, "cpu", tmp_path)
    cfg["zero_optimization"]["offload_optimizer"]["ratio"] = 0.5
    engine, _, _, _ = zerorun.initialize(model=_model(), config=cfg)
    peak = _peak(engine, 2)
    accum = engine.parts.grad_sync.accum
    on_device = [i for i in range(len(accum.buckets)) if not copy_checks.stream().is_pinned(accum.acc[i])]
    dist.destroy_process_group()
    assert on_device == [0, 1] and peak["gradient shard"] == accum.nbytes(host=False) > 0  # DeepSpeed's split


# ---- the overlap ------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [2, 3])
def test_a_units_gradients_travel_to_the_host_while_the_next_unit_computes(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path, stage: int) -> None:
    """At the first gradient of each unit's backward, the reduced chunk of the unit before it is on its way
    to the host (issued on the side stream, its fence not passed); once backward ends, all have landed."""
    monkeypatch.setenv(copy_checks.CHECK_ENV, "deferred")
    engine, _, _, _ = zerorun.initialize(model=_model(), config=_config(stage, "cpu", tmp_path, bf16=False))
    sync, stream = engine.parts.grad_sync, copy_checks.stream()
    sums = {a.data_ptr(): i for i, a in enumerate(sync.accum.acc)}  # fp32: copied straight in
    order: list[int] = []  # buckets in the order their backward started
    travelling: dict[int, list[int]] = {}  # bucket -> buckets whose chunk was in flight as its backward started
    on_grad = sync.on_grad_ready

    def watched(bucket: int, slot: int, param: torch.Tensor) -> None:
        if bucket not in travelling:
            order.append(bucket)
            travelling[bucket] = sorted(sums[c.dst.data_ptr()] for c in stream.inflight if c.side)
        on_grad(bucket, slot, param)

    sync.on_grad_ready = watched
    engine.backward(engine(torch.randn(4, WIDTH)).square().mean())
    left = [c for c in stream.inflight if c.side]
    engine.step()
    dist.destroy_process_group()
    assert len(order) == LAYERS and not left
    for before, now in zip(order, order[1:], strict=False):
        assert before in travelling[now], (order, travelling)
    assert sync.accum.home.landings == LAYERS
