"""zerorun.torch_compat: each entry's private path and its fallback, both run on whatever torch runs
the tests (``FORCE_FALLBACK`` takes the fallback where the private API exists), and they agree."""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist_harness import run_distributed
from zerorun import torch_compat as tc

PATHS = ["private", "fallback"]


@pytest.fixture
def forced(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """The entries forced to their fallback: all of them for the "fallback" run, none otherwise."""
    entries = {"current_graph_task_id", "call_without_subclass", "detached_tls", "tree_leaves", "disable_compile",
               "compiler_runtime_module", "group_timeout_s", "fake_store", "version_counter", "own_parameters",
               "own_buffers", "non_persistent_buffers",
               "queue_backward_callback", "dcp_one_process", "no_torch_function", "running_modules",
               "set_own_parameters", "functorch_transforming"}
    chosen = entries if request.param == "fallback" else set()
    monkeypatch.setattr(tc, "FORCE_FALLBACK", set(chosen))
    yield chosen


def _private_exists(owner: object, name: str) -> None:
    if not hasattr(owner, name):
        pytest.fail(f"this torch ({torch.__version__}) has no {name}: the private path cannot run here")


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_current_graph_task_id_tells_backward_from_forward(forced: set[str]) -> None:
    if forced:  # required: no public fallback; its absence is a clear error naming the API
        with pytest.raises(tc.TorchCompatError, match="_current_graph_task_id"):
            tc.in_backward()
        return
    seen: list[bool] = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: seen.append(tc.in_backward()))
    assert not tc.in_backward()
    y.sum().backward()
    assert seen == [True] and tc.current_graph_task_id() == -1


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_queue_backward_callback_runs_after_the_pass(forced: set[str]) -> None:
    events: list[str] = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2

    def hook(g: torch.Tensor) -> torch.Tensor:
        events.append("hook")
        if forced:
            with pytest.raises(tc.TorchCompatError, match="_execution_engine"):
                tc.queue_backward_callback(lambda: events.append("done"))
        else:
            tc.queue_backward_callback(lambda: events.append("done"))
        return g

    y.register_hook(hook)
    (y * 3).sum().backward()
    assert events == (["hook"] if forced else ["hook", "done"])


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_functorch_transforming_is_seen_inside_torch_func_only(forced: set[str]) -> None:
    seen: list[bool] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append(tc.functorch_transforming())
        return (x * x).sum()

    f(torch.ones(2))
    torch.func.grad(f)(torch.ones(2))
    assert seen == [False, not forced]  # the fallback takes nothing as transformed


class _Guarded(nn.Parameter):
    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        cls.calls += 1
        return tc.call_without_subclass(func, types, args, kwargs)


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_call_without_subclass_runs_the_op_once_as_on_a_plain_tensor(forced: set[str]) -> None:
    p = nn.Parameter(torch.arange(4.0))
    p.__class__ = _Guarded
    _Guarded.calls = 0
    out = torch.add(p, 1, alpha=2)
    assert _Guarded.calls == 1  # the op inside did not dispatch back into the subclass
    assert type(out) is torch.Tensor and torch.equal(out, torch.arange(4.0) + 2)
    assert torch.equal(torch.nn.functional.linear(torch.ones(1, 4), p.view(1, 4)), torch.tensor([[6.0]]))


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_no_torch_function_reads_tensors_without_dispatch(forced: set[str]) -> None:
    p = nn.Parameter(torch.arange(4.0))
    p.__class__ = _Guarded
    _Guarded.calls = 0
    with tc.no_torch_function():
        read = (p.untyped_storage().nbytes(), p.device.type, p.grad)
    assert read == (16, "cpu", None)  # the same values either way
    assert _Guarded.calls == (3 if forced else 0)  # the fallback dispatches as outside
    assert torch.add(p, 1)[0] == 1 and _Guarded.calls == (4 if forced else 1)  # dispatch is back after the with


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_detached_tls_takes_backward_s_object_out_and_puts_it_back(forced: set[str]) -> None:
    # torch 2.12 and older have no torch._C._remove_obj_from_tls: there the fallback is the private path too
    detaches = not forced and all(hasattr(torch._C, name) for name in tc._TLS_NAMES)
    assert tc.tls_can_detach() is detaches
    seen: list[tuple[bool, bool, bool]] = []

    def in_tls() -> bool:
        return bool(torch._C._is_key_in_tls("context")) if hasattr(torch._C, "_is_key_in_tls") else False

    def hook(g: torch.Tensor) -> torch.Tensor:
        before = in_tls()
        with tc.detached_tls("context"):
            inside = in_tls()
        seen.append((before, inside, in_tls()))
        return g

    x = torch.ones(2, requires_grad=True)
    y = x * 3
    y.register_hook(hook)
    y.sum().backward()
    assert len(seen) == 1
    before, inside, after = seen[0]
    assert after == before  # the state after is the state before
    # detached: nothing inside; otherwise left as it is (torch 2.6 keeps no object there at all)
    assert inside == (False if detaches else before)


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_tree_leaves_finds_the_tensors_in_nested_inputs(forced: set[str]) -> None:
    a, b, c = torch.ones(1), torch.zeros(2), torch.full((3,), 2.0)
    pair = collections.namedtuple("pair", "x y")
    tree = ((a, [pair(b, 5)]), {"k": c, "o": collections.OrderedDict(z=None)})
    leaves = tc.tree_leaves(tree)
    assert [id(t) for t in leaves if torch.is_tensor(t)] == [id(a), id(b), id(c)]
    assert [x for x in leaves if not torch.is_tensor(x)] == [5, None]


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_disable_compile_keeps_the_function_and_its_name(forced: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    wrapped: list[object] = []
    if forced:
        real = torch.compiler.disable
        monkeypatch.setattr(torch.compiler, "disable", lambda fn: wrapped.append(fn) or real(fn))

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    f = tc.disable_compile(double)
    assert wrapped == []  # nothing imported or wrapped at decoration time
    assert f.__name__ == "double" and torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(f(torch.ones(1)), torch.full((1,), 2.0))
    assert wrapped == ([double] if forced else [])  # the fallback wraps once, at the first call


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_compiler_runtime_module_names_an_importable_module(forced: set[str]) -> None:
    name = tc.compiler_runtime_module()
    assert name == ("torch.compiler" if forced else "torch._dynamo")
    __import__(name)
    assert name in sys.modules


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_group_timeout_reads_the_group_s_timeout_or_says_it_cannot(forced: set[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=123))
    try:
        group = dist.group.WORLD
        if forced:
            with pytest.raises(AttributeError):
                tc.group_timeout_s(group, torch.device("cpu"))
        else:
            assert tc.group_timeout_s(group, torch.device("cpu")) == 123.0
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_fake_store_is_a_store_and_registers_the_fake_backend(forced: set[str]) -> None:
    store = tc.fake_store()
    assert isinstance(store, dist.Store)
    assert "fake" in dist.Backend.backend_list
    assert type(store).__name__ == ("HashStore" if forced else "FakeStore")


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_version_counter_counts_in_place_writes(forced: set[str]) -> None:
    t = torch.zeros(3)
    if forced:  # required: no public reader
        with pytest.raises(tc.TorchCompatError, match="_version"):
            tc.version_counter(t)
        return
    v0 = tc.version_counter(t)
    t.add_(1)
    t[0] = 5
    assert tc.version_counter(t) == v0 + 2


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.register_parameter("gone", None)
        self.register_buffer("kept", torch.zeros(2))
        self.register_buffer("scratch", torch.ones(1), persistent=False)
        self.child = nn.Linear(2, 2)


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_module_entries_see_a_module_s_own_parameters_and_buffers(forced: set[str]) -> None:
    m = _Net()
    params, buffers = tc.own_parameters(m), tc.own_buffers(m)
    assert params["w"] is m.w and "weight" not in params  # own only, not the child's
    assert set(buffers) == {"kept", "scratch"} and buffers["kept"] is m.kept
    assert ("gone" in params) is not forced  # the live dict keeps the None slot, named_parameters skips it
    assert tc.non_persistent_buffers(m) == {"scratch"}
    new = torch.full((1,), 7.0)
    tc.set_own_buffer(m, "scratch", new)
    assert m.scratch is new and "scratch" not in m.state_dict()  # still a non-persistent buffer
    params["w"].data = torch.zeros(2)
    assert torch.equal(m.w, torch.zeros(2))


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_running_modules_reads_the_calls_under_way_and_parameters_dicts_are_replaced(forced: set[str]) -> None:
    seen: list[list[nn.Module]] = []

    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(tc.running_modules())
            return x

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    outer = Outer()
    outer(torch.ones(1))
    assert [[id(m) for m in ms] for ms in seen] == [[] if forced else [id(outer.inner), id(outer)]]
    assert tc.running_modules() == []  # nothing under way here
    m = nn.Linear(2, 2)
    new = dict(tc.own_parameters(m))
    assert tc.set_own_parameters(m, new) is not bool(forced)
    if not forced:
        assert tc.own_parameters(m) is new and m.weight is new["weight"]


@pytest.mark.parametrize("forced", PATHS, indirect=True)
def test_dcp_one_process_saves_and_loads_without_a_group_and_refuses_a_collective(forced: set[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    import inspect

    import torch.distributed.checkpoint as dcp

    # the no_dist keyword where this torch has it (2.9.1 on; 2.6.0 lacks it), else the call without it
    assert tc._dcp_no_dist(dcp.save) is (not forced and "no_dist" in inspect.signature(dcp.save).parameters)
    want = {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
    tc.dcp_one_process(dcp.save, want, str(tmp_path / "ckpt"))
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    tc.dcp_one_process(dcp.load, got, str(tmp_path / "ckpt"))
    assert all(torch.equal(got[k], want[k]) for k in want)
    # a gloo group of one rank, in a process of its own (torch 2.6's gloo destructor can hang joining its
    # thread, seen once on a loaded machine): both paths write, the collective has no one else to wait for
    assert run_distributed(_dcp_saves_in_a_group_of_one, 1, forced, str(tmp_path / "world1")) == [True]
    dist.init_process_group("fake", store=tc.fake_store(), rank=0, world_size=2)
    try:
        if tc._dcp_no_dist(dcp.save):  # one process alone even inside a larger group
            tc.dcp_one_process(dcp.save, want, str(tmp_path / "world2"))
        else:  # without the keyword it would be a collective the other rank never joins: refused
            with pytest.raises(tc.TorchCompatError, match="no_dist"):
                tc.dcp_one_process(dcp.save, want, str(tmp_path / "world2"))
    finally:
        dist.destroy_process_group()


def _dcp_saves_in_a_group_of_one(rank: int, world: int, forced: set[str], path: str) -> bool:
    import torch.distributed.checkpoint as dcp

    tc.FORCE_FALLBACK = set(forced)
    tc.dcp_one_process(dcp.save, {"w": torch.arange(6.0)}, path)
    return os.path.isdir(path) and bool(os.listdir(path))
