"""Stage 3 as DeepSpeed 0.19.8's ZeRO tests expect it, on 2 gloo ranks (one spawn, three cases):

* ``torch.nn.utils.skip_init`` under ``zero.Init`` (it builds on the meta device, then ``to_empty``):
  the module is sharded once real, with rank 0's values on every rank;
* a tensor taken from a parameter inside ``GatheredParameters`` (``p.detach().cpu()`` shares the
  storage on CPU) keeps its values after the exit, as DeepSpeed's does;
* ``unwrap_model_for_generation``: the whole model gathered and unhooked for the body (a forward there
  equals plain torch on the same weights, with no collective), the hooks back after, training goes on;
* DeepSpeed's parameter methods: ``p.all_gather_coalesced(params).wait()`` gives each parameter its exact
  values (odd sizes: padded shards), ``p.partition()`` shards them again, ``p.all_gather(param_list=...)``
  then ``partition(has_been_updated=True)`` makes rank 0's edit every rank's (under the config key
  ``stage3_use_all_reduce_for_fetch_params``, accepted).
* a submodule that returns its own bias to its caller (``return out, self.bias``): the bias is whole
  (``ds_status`` AVAILABLE) in the caller from the first step, the caller's caller records it in
  ``_external_params`` as DeepSpeed does, no gradient hook piles up on it, and training equals plain
  PyTorch on the global batch;
* every module's parameter dict is DeepSpeed's stage-3 ``ZeROOrderedDict`` (the original kept as
  ``_original_parameters``), in a training and a forward-only engine, and a module attached after
  ``initialize`` is converted too.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import skip_init

from tests.dist_harness import run_distributed

H = 6


def _config() -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


class Skipped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = skip_init(nn.Linear, H, H)
        self.l2 = nn.Linear(H, H)
        self.l3 = skip_init(nn.Linear, H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))


def _skip_init(rank: int, world: int) -> dict:
    import zerorun

    with zerorun.zero.Init(config=_config()):
        model = Skipped()
    out = {"shard": model.l1.weight.ds_tensor.numel(), "sizes": [p.numel() for p in model.parameters()]}
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        out["full"] = [p.detach().clone() for p in model.parameters()]
    return out


def _kept_storage(rank: int, world: int) -> dict:
    import zerorun

    with zerorun.zero.Init(config=_config()):
        model = nn.Linear(H, H)
    taken = {}
    for name, p in model.named_parameters():
        with zerorun.zero.GatheredParameters(p, modifier_rank=None):
            taken[name] = (p.detach().cpu(), p.detach().clone())  # the first shares the gathered storage
    return {"same": all(torch.equal(a, b) for a, b in taken.values()), "numel": model.weight.numel()}


def _unwrap(rank: int, world: int) -> dict:
    import zerorun
    from zerorun.compat.generation import unwrap_model_for_generation

    torch.manual_seed(0)
    engine, *_ = zerorun.initialize(model=nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, 2)),
                                    config=_config())
    x = torch.randn(2, H, generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(x).square().mean())
    engine.step()
    hooked = len(engine.optimizer.parameter_offload.forward_hooks)
    with unwrap_model_for_generation(engine) as unwrapped:
        inside = {"hooks": len(engine.optimizer.parameter_offload.forward_hooks),
                  "whole": all(p.numel() > 0 for p in engine.module.parameters())}
        plain = nn.Sequential(nn.Linear(H, H), nn.Tanh(), nn.Linear(H, 2))
        plain.load_state_dict({k: v.detach().clone() for k, v in engine.module.state_dict().items()})
        before = engine.comm_stats()
        with torch.no_grad():
            inside["equal"] = torch.equal(unwrapped.module(x), plain(x))
        inside["silent"] = engine.comm_stats() == before  # no gather per forward: the hooks are off
    after = {"hooks": len(engine.optimizer.parameter_offload.forward_hooks),
             "sharded": all(p.numel() == 0 for p in engine.module.parameters())}
    loss = engine(x).square().mean()
    engine.backward(loss)
    engine.step()
    return {"hooked": hooked, "inside": inside, "after": after, "finite": bool(torch.isfinite(loss))}


class Holder(nn.Module):
    def __init__(self, numels: list[int]) -> None:
        super().__init__()
        for i, n in enumerate(numels):
            self.register_parameter(f"p{i}", nn.Parameter(torch.arange(1, n + 1, dtype=torch.float32)))


def _param_methods(rank: int, world: int) -> dict:
    import zerorun

    cfg = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 3, "stage3_use_all_reduce_for_fetch_params": True}}
    with zerorun.zero.Init(config=cfg):
        model = Holder([5, 7])
    params = list(model.parameters())
    out: dict = {"resting": [p.numel() for p in params]}
    params[0].all_gather_coalesced(params).wait()
    out["gathered"] = [p.detach().clone() for p in params]
    params[0].partition(param_list=params)
    out["partitioned"] = [p.numel() for p in params]
    params[1].all_gather()
    if rank == 0:
        with torch.no_grad():
            params[1].mul_(10)
    params[1].partition(has_been_updated=True)
    with zerorun.zero.GatheredParameters(params):
        out["edited"] = params[1].detach().clone()
    return out


class Dangling(nn.Linear):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), self.bias  # the bias leaves the module: the caller uses it


class Attn(nn.Linear):
    def __init__(self) -> None:
        super().__init__(H, H)
        self.inner = Dangling(H, H)
        self.seen: list[str] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, bias = self.inner(super().forward(x))
        self.seen.append(getattr(getattr(bias, "ds_status", None), "name", "plain"))
        return out, bias


class Container(nn.Module):  # no parameters of its own: not a unit
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(H, H)
        self.attn = Attn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.attn(torch.tanh(self.first(x)))
        return (out * bias).square().mean()  # the product saves the bias for backward


def _returned(rank: int, world: int) -> dict:
    import zerorun

    torch.manual_seed(0)
    plain = nn.Sequential(Container())
    torch.manual_seed(0)
    engine, *_ = zerorun.initialize(model=nn.Sequential(Container()), config=_config())
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(2 * world, H, generator=torch.Generator().manual_seed(step))
        engine.backward(engine(x[2 * rank:2 * rank + 2]))
        engine.step()
        opt.zero_grad()
        plain(x).backward()
        opt.step()
    c = engine.module[0]
    with zerorun.zero.GatheredParameters(list(engine.module.parameters())):
        same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                   for a, b in zip(engine.module.parameters(), plain.parameters(), strict=True))
    dicts = [type(m._parameters).__name__ for m in engine.module.modules()]
    originals = [type(m._original_parameters) is dict and m._original_parameters == dict(m._parameters)
                 for m in engine.module.modules()]
    c.attn.late = nn.Linear(H, H)  # attached after initialize: converted as it is attached
    dicts.append(type(c.attn.late._parameters).__name__)
    forward_only, *_ = zerorun.initialize(model=nn.Linear(H, H), config={"train_micro_batch_size_per_gpu": 1,
                                                                         "zero_optimization": {"stage": 3}})
    dicts.append(type(forward_only.module._parameters).__name__)
    return {"seen": c.attn.seen, "same": same, "hooks": len(c.attn.inner.bias._backward_hooks or {}),
            "external": [len(m._external_params) for m in (engine.module, c, c.attn, c.attn.inner)],
            "listed": [p is c.attn.inner.bias for _, p in c.ds_external_parameters()],
            "linear": torch.nn.functional.linear is torch._C._nn.linear,  # memory_efficient_linear is on
            "dicts": dicts, "originals": originals}


def _all(rank: int, world: int) -> dict:
    return {"skip_init": _skip_init(rank, world), "kept": _kept_storage(rank, world), "unwrap": _unwrap(rank, world),
            "methods": _param_methods(rank, world), "returned": _returned(rank, world)}


def test_stage3_behaves_as_deepspeeds_zero_tests_expect() -> None:
    results = run_distributed(_all, 2, timeout=240)
    for r in results:
        s = r["skip_init"]
        assert s["sizes"] == [0] * 6  # skip_init's modules are sharded like any other
        assert [t.shape for t in s["full"]] == [(H, H), (H,)] * 3
        assert r["kept"]["same"] and r["kept"]["numel"] == 0  # the taken tensor outlived the gather
        u = r["unwrap"]
        assert u["hooked"] > 0 and u["inside"] == {"hooks": 0, "whole": True, "equal": True, "silent": True}
        assert u["after"] == {"hooks": u["hooked"], "sharded": True} and u["finite"]
        m = r["methods"]
        assert m["resting"] == [0, 0] and m["partitioned"] == [0, 0]
        assert [t.tolist() for t in m["gathered"]] == [list(range(1, 6)), list(range(1, 8))]
        assert m["edited"].tolist() == [10.0 * i for i in range(1, 8)]  # rank 0's edit, on every rank
        ret = r["returned"]
        assert ret["seen"] == ["AVAILABLE"] * 3  # whole in the caller, the first step too
        assert ret["same"] and ret["hooks"] == 0 and ret["linear"]
        assert set(ret["dicts"]) == {"ZeROOrderedDict"} and len(ret["dicts"]) == 7 and all(ret["originals"])
        assert ret["external"] == [0, 1, 0, 0] and ret["listed"] == [True]  # the caller's caller records it
    assert sum(r["skip_init"]["shard"] for r in results) == H * H  # each rank holds its part of l1.weight
    for a, b in zip(results[0]["skip_init"]["full"], results[1]["skip_init"]["full"], strict=True):
        assert torch.equal(a, b) or (a.isnan().any() and torch.equal(a.nan_to_num(), b.nan_to_num()))
