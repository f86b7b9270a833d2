"""DeepSpeed's ZeRO optimizer internals that RLHF code and DeepSpeed's tests read, on zerorun's engine
(zerorun.engine.surface.partition_views, zero_optimizer.BaseOptimizer, the engine's
``allreduce_gradients`` and ``_change_recovery_script_permissions``).

At world 2, gloo, against one process on plain torch over the whole batch:

* ``single_partition_of_fp32_groups`` are the optimizer's own parameters (its state is keyed by them),
  fp32, and together over the ranks they are the model's parameters after each step;
* ``averaged_gradients`` holds, between the boundary backward and the step, gradient chunks whose
  norm over both ranks is the reference gradient's; it is empty before, after the step, on a
  non-boundary micro-step, and under optimizer offload (DeepSpeed's sums are in host memory there);
* inside ``no_sync()`` nothing is reduced, and ``allreduce_gradients()`` reduces it: the chunks are
  then the reference's, and the step is the step of a run without ``no_sync``.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import zerorun
from tests.dist_harness import run_distributed

WORLD = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


def _batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(k)
    return torch.randn(4 * WORLD, 6, generator=g), torch.randn(4 * WORLD, 3, generator=g)


def _config(stage: int, gas: int = 1, offload: bool = False) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": 64}  # several buckets
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 10**6,
            "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False,
            "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}


def _global_norm(tensors: list[torch.Tensor]) -> float:
    sq = torch.stack([t.float().pow(2).sum() for t in tensors]).sum() if tensors else torch.zeros(())
    dist.all_reduce(sq)
    return sq.sqrt().item()


def _reference_grad_norm(batches: list[int], gas: int) -> float:
    model = _model()
    for k in batches:
        x, y = _batch(k)
        (nn.functional.mse_loss(model(x), y) / gas).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()


def _local(k: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _batch(k)
    return x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]


def _views(rank: int, world: int, stage: int) -> dict[str, Any]:
    engine, opt, *_ = zerorun.initialize(model=_model(), config=_config(stage, gas=2))
    out: dict[str, Any] = {}
    parts = opt.single_partition_of_fp32_groups
    own = [p for g in opt.param_groups for p in g["params"]]
    out["partitions are the optimizer's parameters"] = (len(parts) == len(own) >= 2
                                                         and all(a is b for a, b in zip(parts, own, strict=True)))
    out["fp32"] = {p.dtype for p in parts} == {torch.float32}
    out["empty before backward"] = len(opt.averaged_gradients) == 0
    for k in range(2):
        engine.backward(nn.functional.mse_loss(engine(_local(k, rank)[0]), _local(k, rank)[1]))
        if k == 0:
            out["empty on the non-boundary micro-step"] = len(opt.averaged_gradients) == 0
            engine.step()  # counts the micro-step
    grads = opt.averaged_gradients
    out["keyed by group"] = list(grads) == [0]
    out["norm"] = (_global_norm(grads[0]), _reference_grad_norm([0, 1], 2))
    engine.step()
    out["empty after the step"] = len(opt.averaged_gradients) == 0
    out["adam state keyed by partition"] = all("exp_avg" in opt.state[p] for p in parts)
    # the partitions over both ranks are the parameters (fp32 compute: the masters are the owned chunks)
    out["partitions hold the parameters"] = (_global_norm(list(parts)),
                                             torch.cat([p.flatten() for p in engine.module.parameters()]).norm().item())
    base = opt.optimizer
    out["base optimizer"] = (isinstance(base, type(opt)) and base.state is opt.state
                             and base.param_groups is opt.param_groups and not hasattr(base, "optimizer"))
    sd = base.state_dict()
    base.load_state_dict(sd)
    out["base optimizer loads"] = base.state_dict()["state"].keys() == sd["state"].keys()
    engine.destroy()
    return out


@pytest.mark.parametrize("stage", [1, 2])
def test_partitions_and_averaged_gradients(stage: int) -> None:
    for out in run_distributed(_views, WORLD, stage, timeout=240):
        got, want = out.pop("norm")
        assert got == pytest.approx(want, rel=1e-5)
        got, want = out.pop("partitions hold the parameters")
        assert got == pytest.approx(want, rel=1e-6)
        assert all(out.values()), out


def _offloaded(rank: int, world: int) -> tuple[int, int]:
    engine, opt, *_ = zerorun.initialize(model=_model(), config=_config(2, offload=True))
    engine.backward(nn.functional.mse_loss(engine(_local(0, rank)[0]), _local(0, rank)[1]))
    held = len(opt.averaged_gradients)
    engine.step()
    return held, len(opt.single_partition_of_fp32_groups)


def test_no_averaged_gradients_under_optimizer_offload() -> None:
    for held, partitions in run_distributed(_offloaded, WORLD, timeout=240):
        assert held == 0 and partitions >= 2


def _no_sync_then_allreduce(rank: int, world: int) -> dict[str, Any]:
    runs = {}
    for use_no_sync in (False, True):
        engine, opt, *_ = zerorun.initialize(model=_model(), config=_config(1))
        x, y = _local(0, rank)
        if use_no_sync:
            with engine.no_sync():
                engine.backward(nn.functional.mse_loss(engine(x), y))
            runs["held before the reduction"] = len(opt.averaged_gradients)
            engine.allreduce_gradients()
        else:
            engine.backward(nn.functional.mse_loss(engine(x), y))
            engine.allreduce_gradients()  # the boundary pass reduced already: nothing to do
        runs[f"norm {use_no_sync}"] = _global_norm(opt.averaged_gradients[0])
        engine.step()
        runs[f"params {use_no_sync}"] = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
        engine.destroy()
    return runs


def test_allreduce_gradients_reduces_what_no_sync_kept() -> None:
    want = _reference_grad_norm([0], 1)
    for runs in run_distributed(_no_sync_then_allreduce, WORLD, timeout=240):
        assert runs["held before the reduction"] == 0
        assert runs["norm False"] == pytest.approx(want, rel=1e-5)
        assert runs["norm True"] == pytest.approx(want, rel=1e-5)
        torch.testing.assert_close(runs["params True"], runs["params False"], rtol=0, atol=0)


def test_recovery_script_permissions(world_of_one: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Linear(3, 2)
    engine, *_ = zerorun.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}})
    script = tmp_path / "zero_to_fp32.py"
    script.write_text("")
    engine._change_recovery_script_permissions(str(script))
    assert script.stat().st_mode & stat.S_IXUSR
    with caplog.at_level(logging.INFO, logger="DeepSpeed"):
        engine._change_recovery_script_permissions(str(tmp_path / "gone" / "zero_to_fp32.py"))  # no raise
    assert "Could not change permissions" in caplog.text


def _stage3(rank: int, world: int) -> dict[str, Any]:
    engine, opt, *_ = zerorun.initialize(model=_model(), config=_config(3))
    out: dict[str, Any] = {"no fp32 partitions at stage 3": not hasattr(opt, "single_partition_of_fp32_groups")}
    for k in range(2):  # two boundary passes, no step between: the chunks hold their sum (DeepSpeed's test)
        engine.backward(nn.functional.mse_loss(engine(_local(k, rank)[0]), _local(k, rank)[1]))
        engine.allreduce_gradients()  # reduced during backward already: nothing to do
        out[f"norm {k}"] = _global_norm(opt.averaged_gradients[0])
    out["keys"] = list(opt.averaged_gradients)
    engine.step()
    out["empty after the step"] = len(opt.averaged_gradients) == 0
    # DeepSpeed's sub-groups are zerorun's buckets: masters and parameters under stage 3's names
    subgroups = list(zip(opt.fp16_groups, opt.fp32_partitioned_groups_flat, strict=True))
    out["sub-groups"] = (len(subgroups) == len(engine.parts.buckets)
                         and sorted(id(p) for ps, _ in subgroups for p in ps) == sorted(
                             id(p) for p in engine.module.parameters())
                         and all(opt.optimizer.state[m]["step"] == 1 for _, m in subgroups))
    engine.destroy()
    return out


def test_stage3_averaged_gradients_sum_passes_until_the_step() -> None:
    for out in run_distributed(_stage3, WORLD, timeout=240):
        assert out.pop("norm 0") == pytest.approx(_reference_grad_norm([0], 1), rel=1e-5)
        assert out.pop("norm 1") == pytest.approx(_reference_grad_norm([0, 1], 1), rel=1e-5)
        assert out.pop("keys") == [0]
        assert all(out.values()), out


def _flat_buffer(rank: int, world: int, offload: bool) -> dict[str, Any]:
    from zerorun.compat.offload_states import get_state_devices

    engine, opt, *_ = zerorun.initialize(model=_model(), config=_config(3, offload=offload))
    accum = engine.parts.grad_sync.accum
    flat = opt.grad_partitions_flat_buffer
    base = flat.data_ptr()
    ends = [(a.data_ptr() - base) // 4 for a in accum.acc]  # each sum a view of the flat buffer, back to back
    out: dict[str, Any] = {"views": all(a.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
                                        for a in accum.acc)
                           and ends == [sum(b.shard_numel for b in engine.parts.buckets[:i])
                                        for i in range(len(ends))]
                           and flat.numel() == sum(b.shard_numel for b in engine.parts.buckets)}
    engine.backward(nn.functional.mse_loss(engine(_local(0, rank)[0]), _local(0, rank)[1]))
    out["norm"] = _global_norm([flat])
    out["devices"] = {s: get_state_devices(engine, s) for s in ("hp_params", "lp_params", "optim_states", "lp_grads")}
    engine.step()
    engine.destroy()
    return out


@pytest.mark.parametrize("offload", [False, True])
def test_stage3_gradient_sums_are_one_flat_buffer(offload: bool) -> None:
    for out in run_distributed(_flat_buffer, WORLD, offload, timeout=240):
        assert out["views"]
        assert out["norm"] == pytest.approx(_reference_grad_norm([0], 1), rel=1e-5)
        assert out["devices"] == {s: {torch.device("cpu")} for s in out["devices"]}


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.param = nn.Parameter(torch.arange(37, dtype=torch.float32))  # odd: the last chunk is padded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.param


def _unpadded(rank: int, world: int) -> list[tuple[int, float, float]]:
    engine, opt, *_ = zerorun.initialize(model=_Scale(), config=_config(3))
    out = []
    for it in range(2):  # d(sum(x * p))/dp = x = 1, summed over the passes, averaged over the ranks
        engine.backward(engine(torch.ones(37)).sum())
        (piece,) = opt.averaged_gradients[0]
        out.append((piece.numel(), piece.min().item() / (it + 1), piece.max().item() / (it + 1)))
    engine.destroy()
    return out


def test_averaged_gradients_leave_the_padding_out() -> None:
    """One tensor per parameter partition, as DeepSpeed's: a rank's piece holds only the parameter's elements."""
    per_rank = run_distributed(_unpadded, WORLD, timeout=240)
    for it in range(2):
        assert sum(r[it][0] for r in per_rank) == 37
        assert all(r[it][1:] == (1.0, 1.0) for r in per_rank), per_rank
