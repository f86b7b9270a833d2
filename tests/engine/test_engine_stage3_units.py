"""Stage-3 pieces in one process (world size 1, no spawn): the bucket lifecycle, the sharded-read error,
zero.Init's values and a world-of-one training run that matches plain torch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.mechanism.guard import ShardedParameterError, ZeroParameter
from zerorun.engine.mechanism.param_state import ParamState, ParamStateError, check_transition
from zerorun.engine.mechanism.partition import bucket_of, unit_bucket


def _bucket():
    torch.manual_seed(0)
    lin = nn.Linear(3, 5)
    want = [p.detach().clone() for p in (lin.weight, lin.bias)]
    b = unit_bucket([lin.weight, lin.bias], Collectives(None, 1, 0), "lin")
    b.seal()
    return lin, b, want


def test_transitions_are_checked() -> None:
    check_transition(ParamState.SHARDED, ParamState.IN_FLIGHT, "b")
    check_transition(ParamState.IN_FLIGHT, ParamState.GATHERED, "b")
    check_transition(ParamState.GATHERED, ParamState.SHARDED, "b")
    for bad in [(ParamState.SHARDED, ParamState.GATHERED), (ParamState.GATHERED, ParamState.IN_FLIGHT),
                (ParamState.IN_FLIGHT, ParamState.SHARDED), (ParamState.SHARDED, ParamState.SHARDED)]:
        with pytest.raises(ParamStateError, match="cannot go from"):
            check_transition(*bad, "bucket x")


def test_bucket_lifecycle_release_and_gather() -> None:
    lin, b, want = _bucket()
    assert b.state is ParamState.GATHERED and bucket_of(lin.weight) is b
    b.release()
    assert b.state is ParamState.SHARDED and lin.weight.numel() == 0 and b.live_numel == 0
    with pytest.raises(ParamStateError):
        b.release()  # already sharded
    b.gather_async()
    with pytest.raises(ParamStateError):
        b.gather_async()  # in flight: a second all-gather is a bug
    b.wait()
    assert torch.equal(lin.weight, want[0]) and torch.equal(lin.bias, want[1])
    assert b.held_bytes() == 4 * (b.local.numel() + b.plan.padded_numel)


def test_reading_a_sharded_parameter_names_gathered_parameters() -> None:
    import zerorun

    lin, b, want = _bucket()
    b.release()
    w = lin.weight
    assert isinstance(w, ZeroParameter) and isinstance(w, nn.Parameter)
    for read in (lambda: w.sum(), lambda: repr(w), lambda: w[0], lambda: torch.nn.functional.linear(
            torch.ones(1, 3), w)):
        with pytest.raises(ShardedParameterError, match="GatheredParameters") as info:
            read()
        assert "GatheredParameters" in info.value.hint and "(5, 3)" in info.value.message
    assert w.requires_grad and w.is_leaf and w.dtype == torch.float32  # metadata stays readable
    with zerorun.zero.GatheredParameters([w]):
        assert torch.equal(w, want[0])
    assert b.state is ParamState.SHARDED  # released again on exit


def test_init_and_world_of_one_training_match_plain_torch() -> None:
    import zerorun

    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "stage3_max_reuse_distance": 0}}

    def build() -> nn.Module:
        torch.manual_seed(7)
        return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))

    with zerorun.zero.Init(config=cfg):
        model = build()
    ref = build()
    assert all(p.numel() == 0 for p in model.parameters())
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))
    engine, *_ = zerorun.initialize(model=model, config=cfg)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(step))
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        ref_loss = ref(x).square().mean()
        opt.zero_grad()
        ref_loss.backward()
        opt.step()
        torch.testing.assert_close(loss.detach(), ref_loss.detach())
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        for a, b in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.detach(), b.detach())
    stats = engine.comm_stats()
    assert stats["all_gather"]["calls"] > 0 and stats["reduce_scatter"]["calls"] > 0


def test_zero_init_builds_on_the_engine_device_and_model_to_keeps_binding() -> None:
    """Every module's parameters go to ``ctx.device`` through the one counted move before they are
    packed; the buckets live there, and after ``model.to(device)`` a gather still binds the
    parameters as views of the bucket. No GPU here, so ``ctx.device`` is the CPU: what is checked is
    that each move is asked for with the engine's device and that the buckets are built from it."""
    import zerorun
    from zerorun.engine.comm.bootstrap import init_distributed
    from zerorun.engine.mechanism.placement import watch_moves

    cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    device = init_distributed().device
    moves: list[tuple[int, torch.device]] = []
    with watch_moves(lambda ts, dev: moves.append((sum(t.numel() for t in ts), dev))), zerorun.zero.Init(config=cfg):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(4, 6), nn.MultiheadAttention(6, 2))  # its constructor writes out_proj
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(4, 6), nn.MultiheadAttention(6, 2))
    n_lin, n_attn = 4 * 6 + 6, sum(p.numel() for p in ref[1].parameters(recurse=False))
    assert moves == [(n_lin, device), (6 * 6 + 6, device), (n_attn, device)], moves  # one move per module
    buckets = {id(b): b for p in model.parameters() if (b := bucket_of(p)) is not None}.values()
    assert all(b.local.device == device and b.data.device == device for b in buckets)
    model.to(device)
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            same_storage = p.untyped_storage().data_ptr() == bucket_of(p).data.untyped_storage().data_ptr()
            assert same_storage and p.device == device  # a view of its bucket
            assert torch.equal(p, q)  # out_proj.bias = 0 written by MultiheadAttention's constructor


def test_a_refill_bumps_the_buffers_version_never_the_parameters() -> None:
    """Why stage 3 needs no version-counter reset (9b6a4ae called torch's private
    ``_unsafe_set_version_counter`` with a tuple, a form torch has only from 2.7): what autograd
    saves shares the parameter's counter, and the refill writes only the buffer's."""
    lin, b, _ = _bucket()
    x = torch.randn(2, 3)
    out = lin(x)  # saves the weight (a view of the gathered buffer, bound by p.data = view)
    weight_version, buffer_version = lin.weight._version, b._full._version
    b.release()
    b.gather()  # the refill before backward: the shard copy and the all-gather write the buffer
    assert b._full._version > buffer_version
    assert lin.weight._version == weight_version
    out.sum().backward()  # no "modified by an inplace operation" error
    assert torch.equal(lin.weight.grad, torch.ones(5, 2) @ x)


def test_stage_3_trains_without_the_private_version_counter_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """On torch 2.4-2.6 the tuple form raised TypeError at the first backward; the call is gone."""
    import zerorun

    def refuse(*args: object) -> None:
        raise TypeError("_unsafe_set_version_counter(): incompatible function arguments (torch < 2.7)")

    monkeypatch.setattr(torch._C._autograd, "_unsafe_set_version_counter", refuse, raising=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "stage3_max_reuse_distance": 0}}
    engine, *_ = zerorun.initialize(model=model, config=cfg)
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 4)).square().mean())
        engine.step()
    assert engine.global_steps == 2


def test_units_are_aligned_to_16_bytes_of_bf16() -> None:
    """Every slot starts, and every rank's chunk is, a whole number of ALIGN_ELEMENTS (as stages 0-2)."""
    from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS

    lin = nn.Linear(3, 5)
    for world in (1, 2, 3):
        b = unit_bucket([lin.weight, lin.bias], Collectives(None, world, 0), "lin")
        assert all(s.offset % ALIGN_ELEMENTS == 0 for s in b.plan.slots), b.plan.slots
        assert b.plan.padded_numel % (world * ALIGN_ELEMENTS) == 0
        assert b.shard_numel % ALIGN_ELEMENTS == 0
