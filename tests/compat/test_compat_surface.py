"""The ``deepspeed`` surface itself: accelerator (CPU, and CUDA with torch.cuda mocked because
no GPU exists here), ops.adam semantics, DeepSpeedConfig, set_random_seed, ZeroParamStatus,
and deepspeed.comm's collectives on 2 gloo ranks."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import zerorun
from tests.dist_harness import run_distributed
from zerorun.compat import accelerator as acc_mod
from zerorun.compat import comm
from zerorun.compat.accelerator import CpuAccelerator, CudaAccelerator, get_accelerator
from zerorun.compat.config import DeepSpeedConfig
from zerorun.compat.optimizers import DeepSpeedCPUAdam, FusedAdam
from zerorun.compat.params import ZeroParamStatus, param_status
from zerorun.compat.runtime_utils import set_random_seed
from zerorun.errors import UnsupportedFeature


def test_cpu_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    a = get_accelerator()
    assert isinstance(a, CpuAccelerator) and a is get_accelerator()
    assert (a.device_name(), a.device_name(1), a.current_device_name(), a.device()) == ("cpu", "cpu", "cpu",
                                                                                     torch.device("cpu"))
    assert a.is_available() and a.device_count() == 3 and a.communication_backend_name() == "gloo"
    assert a.is_bf16_supported() and torch.bfloat16 in a.supported_dtypes()
    a.set_device(0)
    a.synchronize()
    a.empty_cache()
    assert 0 < a.memory_allocated() <= a.total_memory() and 0 < a.available_memory() <= a.total_memory()
    assert a.max_memory_allocated() >= a.memory_allocated() > 0 and "allocated_bytes.all.current" in a.memory_stats()
    a.manual_seed(5)
    first = torch.rand(2)
    a.manual_seed_all(5)
    assert torch.equal(torch.rand(2), first)
    with a.stream(a.Stream()):
        pass
    assert a.on_accelerator(torch.zeros(1)) and a.FloatTensor([1.0]).dtype == torch.float32
    assert a.pin_memory(torch.ones(1)).device.type == "cpu"
    with pytest.raises(UnsupportedFeature, match="op builders"):
        a.get_op_builder("CPUAdamBuilder")


def test_cuda_accelerator_delegates_to_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch.cuda's functions are replaced by recorders (the only mocking in this file)."""
    calls: list = []
    fake = {"is_available": lambda: True, "device_count": lambda: 4, "current_device": lambda: 2,
            "set_device": lambda i: calls.append(("set_device", i)),
            "synchronize": lambda i=None: calls.append(("synchronize", i)),
            "empty_cache": lambda: calls.append(("empty_cache",)),
            "memory_allocated": lambda i=None: 123, "max_memory_allocated": lambda i=None: 456,
            "memory_reserved": lambda i=None: 789, "reset_peak_memory_stats": lambda i=None: calls.append(("reset", i)),
            "memory_stats": lambda i=None: {"x": 1}, "mem_get_info": lambda i=None: (10, 20),
            "is_bf16_supported": lambda: True, "manual_seed": lambda s: calls.append(("seed", s))}
    for name, fn in fake.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    a = get_accelerator()
    assert isinstance(a, CudaAccelerator)
    assert (a.device_name(), a.device_name(1), a.current_device_name()) == ("cuda", "cuda:1", "cuda:2")
    assert (a.device_count(), a.communication_backend_name(), a.is_bf16_supported()) == (4, "nccl", True)
    a.set_device(3)
    a.synchronize()
    a.empty_cache()
    a.reset_max_memory_allocated()
    a.manual_seed(7)
    assert (a.memory_allocated(), a.max_memory_allocated(), a.memory_reserved(), a.available_memory()) == (
        123, 456, 789, 10)
    assert a.memory_stats() == {"x": 1} and a.visible_devices_envs() == ["CUDA_VISIBLE_DEVICES"]
    assert calls == [("set_device", 3), ("synchronize", None), ("empty_cache",), ("reset", None), ("seed", 7)]


def test_cuda_total_memory_reads_the_current_device_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``total_memory()`` is the current device's (device 2 here), as every other query, not device 0's."""
    from types import SimpleNamespace

    sizes = {0: 80 << 30, 2: 40 << 30}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=sizes[i]))
    a = CudaAccelerator()
    assert a.total_memory() == 40 << 30 and a.total_memory(0) == 80 << 30


def test_unknown_accelerator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "xpu")
    with pytest.raises(UnsupportedFeature, match="accelerator 'xpu'"):
        acc_mod.get_accelerator()


def _params() -> list[nn.Parameter]:
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(3))]


def _run(opt_factory, steps: int = 4) -> list[torch.Tensor]:
    params = _params()
    opt = opt_factory(params)
    for step in range(steps):
        for p in params:
            p.grad = torch.full_like(p, 0.1 * (step + 1)) + p.detach() * 0.5
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("cls", [DeepSpeedCPUAdam, FusedAdam])
def test_adam_modes_match_torch(cls: type) -> None:
    mode = "adamw_mode" if cls is DeepSpeedCPUAdam else "adam_w_mode"
    got_w = _run(lambda p: cls(p, lr=0.01, weight_decay=0.1, **{mode: True}))
    # they build torch's fused kernel (as fast as DeepSpeed's own on the CPU): exactly its update
    assert cls(_params(), lr=0.01).defaults["fused"] is True
    want_w = _run(lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True))
    got_l2 = _run(lambda p: cls(p, lr=0.01, weight_decay=0.1, **{mode: False}))
    want_l2 = _run(lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, fused=True))
    for a, b in zip(got_w + got_l2, want_w + want_l2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(got_w, got_l2, strict=True))  # the modes differ


def test_adam_without_bias_correction_follows_deepspeeds_formula() -> None:
    got = _run(lambda p: FusedAdam(p, lr=0.01, bias_correction=False, weight_decay=0.1))
    params = _params()
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    with torch.no_grad():
        for step in range(4):
            for i, p in enumerate(params):
                g = torch.full_like(p, 0.1 * (step + 1)) + p * 0.5
                p.mul_(1 - 0.01 * 0.1)  # decoupled weight decay
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                p -= 0.01 * m[i] / (v[i].sqrt() + 1e-8)
    for a, b in zip(got, params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(UnsupportedFeature, match="amsgrad"):
        DeepSpeedCPUAdam(_params(), amsgrad=True)


def test_fused_adam_as_a_client_optimizer_at_stage_2_equals_torch_adamw() -> None:
    results = []
    for make in (lambda p: FusedAdam(p, lr=0.01, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=0.01,
                                                                                               weight_decay=0.1)):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        engine, *_ = zerorun.initialize(model=model, optimizer=make(model.parameters()),
                                        config={"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}})
        for step in range(3):
            engine.backward(engine(torch.full((2, 4), float(step + 1))).sum())
            engine.step()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_deepspeed_config_reads_the_resolved_values() -> None:
    c = DeepSpeedConfig({"train_batch_size": 8, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
                         "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (8, 4, 2)
    assert (c.zero_optimization_stage, c.zero_enabled, c.bfloat16_enabled, c.fp16_enabled) == (2, True, True, False)
    assert (c.optimizer_name, c.optimizer_params, c.gradient_clipping) == ("AdamW", {"lr": 1e-3}, 1.0)


def test_set_random_seed_seeds_python_and_torch() -> None:
    set_random_seed(11)
    a = (random.random(), torch.rand(2))
    set_random_seed(11)
    b = (random.random(), torch.rand(2))
    assert a[0] == b[0] and torch.equal(a[1], b[1])


def test_zero_param_status_follows_the_stage3_lifecycle() -> None:
    plain = nn.Parameter(torch.zeros(2))
    assert param_status(plain) is ZeroParamStatus.AVAILABLE
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    zerorun.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": 0}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    w = model[0].weight
    assert param_status(w) is ZeroParamStatus.NOT_AVAILABLE
    with zerorun.zero.GatheredParameters([w]):
        assert param_status(w) is ZeroParamStatus.AVAILABLE
    assert param_status(w) is ZeroParamStatus.NOT_AVAILABLE


def _comm_ops(rank: int, world: int) -> dict:
    comm.init_distributed()  # reuses the harness's group
    t = torch.tensor([float(rank + 1)])
    comm.all_reduce(t)
    gathered = [torch.zeros(1) for _ in range(world)]
    comm.all_gather(gathered, torch.tensor([float(rank)]))
    flat = torch.zeros(world)
    comm.all_gather_into_tensor(flat, torch.tensor([float(10 * rank)]))
    b = torch.tensor([float(rank)])
    comm.broadcast(b, src=1)
    rs = torch.zeros(1)
    comm.reduce_scatter_tensor(rs, torch.arange(world, dtype=torch.float32) + rank)
    work = comm.all_reduce(torch.ones(1), async_op=True)
    work.wait()
    comm.barrier()
    return {"sum": t.item(), "gathered": [g.item() for g in gathered], "flat": flat.tolist(), "b": b.item(),
            "rs": rs.item(), "rank": comm.get_rank(), "world": comm.get_world_size(),
            "local": comm.get_local_rank(), "init": comm.is_initialized()}


def test_comm_collectives_on_two_ranks() -> None:
    out = run_distributed(_comm_ops, 2, timeout=120)
    for rank, r in enumerate(out):
        assert (r["sum"], r["gathered"], r["flat"], r["b"]) == (3.0, [0.0, 1.0], [0.0, 10.0], 1.0)
        assert r["rs"] == 2 * rank + 1  # element `rank` of arange(2) + 0, plus of arange(2) + 1
        assert (r["rank"], r["world"], r["local"], r["init"]) == (rank, 2, rank, True)


def test_initialize_takes_deepspeeds_parameter_order() -> None:
    import argparse

    from zerorun.compat.surface import initialize

    model = nn.Linear(3, 1)
    args = argparse.Namespace(deepspeed_config={"train_micro_batch_size_per_gpu": 2,
                                                "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    data = torch.utils.data.TensorDataset(torch.randn(6, 3))
    engine, opt, loader, sched = initialize(args, model, None, model.parameters(), data)  # DeepSpeed's order
    assert engine.module is model and isinstance(opt, torch.optim.SGD) and sched is None
    assert len(list(loader)) == 3


def test_zero_init_takes_deepspeeds_arguments() -> None:
    from zerorun.compat.zero_init import Init, register_external_parameter
    from zerorun.engine.mechanism.partition import bucket_of

    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    with Init(remote_device="cpu", pin_memory=True, dtype=torch.float32, config_dict_or_path=cfg):
        model = nn.Linear(4, 4)
    assert bucket_of(model.weight) is not None  # built already sharded, as zerorun.zero.Init does
    for kwargs, what in (({"mpu": object()}, "mpu"), ({"zero_param_parallel_group": object()}, "hpZ")):
        with pytest.raises(UnsupportedFeature, match=what):
            Init(config_dict_or_path=cfg, **kwargs)
    with pytest.raises(UnsupportedFeature, match="register_external_parameter"):
        register_external_parameter(model, model.weight)
