"""The host step of optimizer offload: its kernel, its threads, its pipeline over chunks, Twin-Flow.

No GPU here. The pipeline is seen through the deferred-copy stand-in
(``ZERORUN_CHECK_COPIES=deferred``, zerorun.engine.offload.copy_checks), in which a queued
copy is complete only once its fence is waited for, and every tensor the copier did not
pin stands for a device tensor: so "on the accelerator" below means "not in the stand-in's
pinned host memory", and the accelerator's bytes are those of the masters there and of the
optimizer state torch creates beside them (``zeros_like`` of the master).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import zerorun
from zerorun.engine.offload.copy_checks import CHECK_ENV, DeferredTransfers
from zerorun.engine.offload.threads import STEP_THREADS_ENV, step_threads, threads_for_step
from zerorun.engine.training.host_kernel import HostKernelHint, fuses_on_cpu
from zerorun.engine.training.optim_factory import build_optimizer

LAYERS, WIDTH, STEPS = 4, 16, 3


pytestmark = pytest.mark.usefixtures("world_of_one")  # tests/conftest.py


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _config(stage: int, offload: dict[str, Any] | None, **params: Any) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": WIDTH * WIDTH + WIDTH}  # a bucket per layer
    if offload is not None:
        zero["offload_optimizer"] = offload
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, **params}}}


def _train(engine: Any) -> list[float]:
    g = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(4, WIDTH, generator=g), torch.randn(4, WIDTH, generator=g)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def _params(engine: Any) -> list[torch.Tensor]:
    with zerorun.zero.GatheredParameters(list(engine.module.parameters())):
        return [p.detach().clone() for p in engine.module.parameters()]


# ---- the kernel ---------------------------------------------------------------------------------
def test_a_host_step_is_fused_where_torch_fuses_and_foreach_elsewhere() -> None:
    p = [nn.Parameter(torch.ones(4))]
    for name in ("Adam", "AdamW", "SGD", "Adagrad"):
        assert fuses_on_cpu(type(build_optimizer(name, {"lr": 0.1}, p))), name
        assert build_optimizer(name, {"lr": 0.1}, p, host_step=True).defaults["fused"] is True, name
        assert build_optimizer(name, {"lr": 0.1}, p).defaults["foreach"] is True, name  # no offload: as before
    assert build_optimizer("RMSprop", {"lr": 0.1}, p, host_step=True).defaults["foreach"] is True  # not fused
    chosen = build_optimizer("AdamW", {"lr": 0.1, "fused": False}, p, host_step=True)  # the config's choice stands
    assert not chosen.defaults["fused"] and not chosen.defaults["foreach"]


def test_fused_steps_within_a_few_ulps_of_foreach() -> None:
    """Why the offload parity suites compare with a fused reference: the kernels round differently."""
    torch.manual_seed(0)
    start, grads = torch.randn(10_000), [torch.randn(10_000) for _ in range(20)]
    out = []
    for kernel in ({"fused": True}, {"foreach": True}):
        p = nn.Parameter(start.clone())
        opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.01, **kernel)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        out.append(p.detach())
    torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-6)


def test_a_client_optimizer_is_left_alone_with_a_hint() -> None:
    def run(offload: dict[str, Any] | None, **kernel: Any) -> tuple[torch.optim.Optimizer, list[str]]:
        cfg = _config(2, offload)
        del cfg["optimizer"]
        model = _model()
        client = torch.optim.AdamW(model.parameters(), lr=1e-2, **kernel)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, opt, _, _ = zerorun.initialize(model=model, optimizer=client, config=cfg)
        dist.destroy_process_group()
        return opt, [str(w.message) for w in caught if issubclass(w.category, HostKernelHint)]

    opt, hints = run({"device": "cpu"}, foreach=True)
    assert not opt.defaults["fused"] and len(hints) == 1 and "fused=True" in hints[0] and "\n" not in hints[0]
    assert run({"device": "cpu"}, fused=True)[1] == [] and run(None)[1] == []


# ---- the threads --------------------------------------------------------------------------------
def test_the_step_takes_the_nodes_cores_over_its_local_ranks() -> None:
    # torchrun's OMP_NUM_THREADS=1 on 64 cores, 8 ranks: 8 each for the step
    assert step_threads({"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "1"}, affinity=64) == 8
    # the launcher's share (cores / local ranks) is the same figure: nothing changes
    assert step_threads({"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "8"}, affinity=64) == 8
    # bound to its own 8 cores (--bind_cores_to_rank): all of them, never more
    assert step_threads({"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "8"}, affinity=8) == 8
    assert step_threads({"LOCAL_WORLD_SIZE": "4"}, affinity=2) == 1
    assert step_threads({STEP_THREADS_ENV: "3"}, affinity=2) == 3
    # started by mpirun itself (no LOCAL_WORLD_SIZE): its local size, not every core for each of 8 ranks
    assert step_threads({"OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMP_NUM_THREADS": "1"}, affinity=64) == 8
    assert step_threads({"MPI_LOCALNRANKS": "4"}, affinity=64) == 16
    before = torch.get_num_threads()
    with threads_for_step(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(("cores", "local_ranks"), [(2, 1), (2, 2), (2, 4), (16, 3), (64, 8), (96, 7)])
def test_the_step_agrees_with_the_launchers_thread_share(cores: int, local_ranks: int) -> None:
    """Under zerorun (OMP_NUM_THREADS unset: the launcher gives each rank its share) the step keeps that share."""
    from launcher.plan.threads import threads_for

    share = threads_for({}, None, local_ranks, cores)
    assert share is not None
    assert step_threads({"LOCAL_WORLD_SIZE": str(local_ranks), "OMP_NUM_THREADS": share}, affinity=cores) == int(share)


def test_a_one_thread_rank_steps_its_host_masters_on_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank started with one thread (torchrun's OMP_NUM_THREADS=1) steps on its share of the node's cores,
    here all 4 of a (pretended) 4-core node with one local rank; forward and backward keep the one thread."""
    from zerorun.engine.offload import threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.delenv(STEP_THREADS_ENV, raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine, opt, _, _ = zerorun.initialize(model=_model(), config=_config(2, {"device": "cpu"}))
        inner_step, seen = opt.step, []

        def step(*args: Any, **kwargs: Any) -> Any:
            seen.append(torch.get_num_threads())
            return inner_step(*args, **kwargs)

        monkeypatch.setattr(opt, "step", step)
        engine.backward(engine(torch.ones(4, WIDTH)).square().mean())
        assert torch.get_num_threads() == 1
        engine.step()
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {4} and after == 1


# ---- the pipeline -------------------------------------------------------------------------------
def test_the_next_chunk_steps_while_the_last_ones_upload_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk k steps while the masters of the chunks before it are still going up (queued, their fences
    not yet waited for), no gradient comes down at the step (each reduced chunk landed in its host sum
    during backward: zerorun.engine.offload.host_grads), and the result is exactly that of no offload."""
    monkeypatch.setenv(CHECK_ENV, "deferred")
    engine, opt, _, _ = zerorun.initialize(model=_model(), config=_config(2, {"device": "cpu", "pin_memory": True}))
    masters = engine.parts.masters
    assert isinstance(masters.copies, DeferredTransfers) and len(masters.step_chunks()) == LAYERS
    stream, seen = masters.copies.stream, []
    index = {m.data.untyped_storage().data_ptr(): i for i, m in enumerate(masters.masters)}
    inner_step = opt.step

    def step(*args: Any, **kwargs: Any) -> Any:
        now = [index[m.data.untyped_storage().data_ptr()] for g in opt.param_groups for m in g["params"]]
        up = sorted(index[c.src.untyped_storage().data_ptr()] for c in stream.inflight
                    if not c.to_host and c.src.untyped_storage().data_ptr() in index)
        down = sum(c.to_host for c in stream.inflight)
        seen.append((now, up, down))
        return inner_step(*args, **kwargs)

    monkeypatch.setattr(opt, "step", step)
    losses, params = _train(engine), _params(engine)
    dist.destroy_process_group()
    first = seen[:LAYERS]
    assert [now for now, _, _ in first] == [[k] for k in range(LAYERS)]
    # the chunks before k still going up: nothing waits for them until the next step writes the masters
    assert [up for _, up, _ in first] == [list(range(k)) for k in range(LAYERS)]
    assert [down for _, _, down in first] == [0] * LAYERS  # the gradients are in host memory already
    monkeypatch.delenv(CHECK_ENV)
    plain, _, _, _ = zerorun.initialize(model=_model(), config=_config(2, None, fused=True))
    assert _train(plain) == losses and all(torch.equal(a, b) for a, b in zip(_params(plain), params, strict=True))


# ---- Twin-Flow ----------------------------------------------------------------------------------
def test_ratio_half_keeps_half_of_the_state_on_the_compute_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK_ENV, "deferred")
    out = {}
    for ratio in (0.5, 1.0):
        engine, opt, _, _ = zerorun.initialize(
            model=_model(), config=_config(3, {"device": "cpu", "pin_memory": True, "ratio": ratio}))
        masters = engine.parts.masters
        losses, params = _train(engine), _params(engine)
        on_accelerator = [not masters.copies.on_host(m) for m in masters.masters]
        sides = [0, 0]  # the accelerator's bytes, the host's: each master and the state torch made beside it
        for m, device in zip(masters.masters, on_accelerator, strict=True):
            state = [v for v in opt.state[m].values() if torch.is_tensor(v)]
            sides[not device] += sum(t.numel() * t.element_size() for t in [m, *state])
        out[ratio] = {"losses": losses, "params": params, "sides": sides, "reported": masters.state_bytes(opt),
                      "n": len(masters.masters), "device": on_accelerator}
        dist.destroy_process_group()
    half, whole = out[0.5], out[1.0]
    assert half["n"] == LAYERS and half["device"] == [True, True, False, False]  # DeepSpeed: i < int((1-r)*n)
    assert half["sides"][0] == half["sides"][1] > 0 and whole["sides"][0] == 0
    assert half["reported"][0] == half["sides"][0]  # the engine's own figure says the same
    assert half["losses"] == whole["losses"]
    assert all(torch.equal(a, b) for a, b in zip(half["params"], whole["params"], strict=True))


def test_the_estimate_shows_the_ratios_bytes_on_each_side() -> None:
    from zerorun.estimate.model_states import Offload, Placement, Training, model_states

    training = Training(7_000_000_000, 1)
    whole = model_states(training, Placement(3, Offload.CPU))
    half = model_states(training, Placement(3, Offload.CPU, offload_ratio=0.5))
    optimizer = whole.cpu
    # the device's share keeps its master, state and gradient sums (the host held the offloaded ones)
    kept = half.gpu["optimizer_states"] + half.gpu["grad_accum"] + half.gpu["gradients"]
    assert kept == pytest.approx(optimizer / 2, abs=2) and whole.gpu["gradients"] == 0
    assert half.cpu == pytest.approx(optimizer / 2, abs=2) and whole.gpu["optimizer_states"] == 0
    assert Placement(3, Offload.CPU, offload_ratio=0.5).offload_label == "opt:cpu@0.5"


def test_ratio_below_one_needs_stage_three_and_offload() -> None:
    from zerorun.estimate.model_states import Offload, Placement, PlacementError

    with pytest.raises(PlacementError, match="stage 3"):
        Placement(2, Offload.CPU, offload_ratio=0.5)
    assert os.environ.get(CHECK_ENV) is None
