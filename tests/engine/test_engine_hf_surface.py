"""What libraries written for DeepSpeed ZeRO-3 read from the engine, on 2 gloo ranks.

* DeepSpeed's per-parameter attributes (``ds_status``, ``ds_id``, ``ds_numel``, ``ds_shape``,
  ``ds_tensor``, ``ds_persist``, ``ds_active_sub_modules``) through a bucket's whole life
  (sharded, in flight, gathered by a forward and by ``GatheredParameters``, released);
* engines without an optimizer (reference / teacher models) at stages 0-3: their forward
  equals the plain model's, backward and step raise, and they hold no master or
  optimizer state;
* TRL's generation helper's hook removal and re-registration (its own ``remove_hooks`` /
  ``add_hooks``) between two training steps: the forward inside runs on the gathered
  weights without gathering or releasing, and training stays on the single-process
  trajectory;
* ``optimizer.overflow`` after a step.

One spawned group runs every case; the single-process references run in the test.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from tests.dist_harness import run_distributed

WORLD, LR, MICRO = 2, 0.05, 3
pytestmark = pytest.mark.timeout(300)


class Net(nn.Module):
    """Two Linears (sharded) and a LayerNorm of 8 elements (persistent under a threshold of 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc2(torch.relu(self.fc1(x))))


def _config(stage: int, optimizer: bool) -> dict:
    zero = {"stage": stage, **({"stage3_param_persistence_threshold": 10} if stage == 3 else {})}
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10**6, "gradient_clipping": 0.0,
           "zero_optimization": zero}
    if optimizer:
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": LR}}
    return cfg


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(WORLD * MICRO, 6, generator=g), torch.randn(WORLD * MICRO, 4, generator=g)


def _mine(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * MICRO:(rank + 1) * MICRO]


def _attrs(p: nn.Parameter) -> dict:
    return {"status": p.ds_status.name, "numel": p.ds_numel, "shape": tuple(p.ds_shape), "persist": p.ds_persist,
            "active": len(p.ds_active_sub_modules), "id": p.ds_id, "external": p.is_external_param}


# ---- ds_* attributes ------------------------------------------------------------------------
def _attribute_case(rank: int) -> dict:
    import zerorun
    from zerorun.compat.params import is_zero_param
    from zerorun.engine.mechanism.partition import bucket_of

    engine, *_ = zerorun.initialize(model=_net(), config=_config(3, optimizer=True))
    module = engine.module
    out: dict = {"at_rest": {n: _attrs(p) for n, p in module.named_parameters()},
                 "is_zero_param": all(is_zero_param(p) for p in module.parameters())}
    seen: dict = {}
    module.fc2.register_forward_pre_hook(lambda m, a: seen.update(
        {n: _attrs(p) for n, p in m.named_parameters()}))
    x, y = _batch(0)
    engine.backward(F.mse_loss(engine(_mine(x, rank)), _mine(y, rank)))
    out["in_forward"] = seen
    out["after_backward"] = {n: p.ds_status.name for n, p in module.named_parameters()}
    engine.step()
    b = bucket_of(module.fc1.weight)
    b.gather_async()
    out["in_flight"] = module.fc1.weight.ds_status.name
    b.wait()
    out["gathered"] = module.fc1.weight.ds_status.name
    b.release()
    # ds_tensor is this rank's part of the resting shard: every rank's parts, in rank order, make the weight
    parts = {n: p.ds_tensor.clone() for n, p in module.named_parameters()}
    with zerorun.zero.GatheredParameters(list(module.parameters())):
        out["inside_gathered"] = {n: p.ds_status.name for n, p in module.named_parameters()}
        full = {n: p.detach().clone().reshape(-1) for n, p in module.named_parameters()}
    everyone: list = [None] * WORLD
    dist.all_gather_object(everyone, parts)
    out["ds_tensor_joins"] = {n: torch.equal(torch.cat([e[n] for e in everyone]), full[n]) for n in full}
    out["ds_tensor_sizes"] = {n: p.ds_tensor.numel() for n, p in module.named_parameters()}
    out["released"] = {n: p.ds_status.name for n, p in module.named_parameters()}
    out["overflow"] = engine.optimizer.overflow
    return out


# ---- engines without an optimizer ------------------------------------------------------------
def _forward_only_case(rank: int, stage: int) -> dict:
    import zerorun
    from zerorun.engine.errors import EngineError

    model = _net()
    plain = copy.deepcopy(model)
    engine, optimizer, _, scheduler = zerorun.initialize(model=model, config=_config(stage, optimizer=False))
    outs, errors = [], []
    for step in range(2):  # the second forward follows the order the first one recorded
        x, _ = _batch(step)
        with torch.no_grad():
            outs.append((engine(_mine(x, rank)) - plain(_mine(x, rank))).abs().max().item())
    x, y = _batch(0)
    loss = F.mse_loss(engine(_mine(x, rank)), _mine(y, rank))
    for call in (lambda: engine.backward(loss), engine.step):
        try:
            call()
            errors.append(None)
        except EngineError as e:
            errors.append((e.message, e.hint))
    statuses = sorted({p.ds_status.name for p in model.parameters()}) if stage == 3 else []
    return {"max_diff": max(outs), "optimizer": optimizer, "engine_optimizer": engine.optimizer,
            "scheduler": scheduler, "errors": errors, "memory": engine.memory_breakdown(), "statuses": statuses}


# ---- TRL's generation helper between two training steps --------------------------------------
def _generation_case(rank: int) -> dict:
    from trl.models.utils import add_hooks, remove_hooks

    import zerorun
    from zerorun.engine.mechanism.param_state import ParamState
    from zerorun.engine.mechanism.partition import bucket_of

    engine, *_ = zerorun.initialize(model=_net(), config=_config(3, optimizer=True))
    module, coordinator = engine.module, engine.parts.coordinator
    losses, out = [], {}
    for step in range(3):
        x, y = _batch(step)
        loss = F.mse_loss(engine(_mine(x, rank)), _mine(y, rank))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if step == 0:  # what trl's unwrap_model_for_generation does at stage 3
            with zerorun.zero.GatheredParameters(module.parameters()):
                remove_hooks(engine)
                out["handles_while_off"] = len(coordinator.handles)
                with torch.no_grad():
                    out["generated"] = module(x).tolist()  # the whole batch: every rank the same
                out["states_after_forward"] = sorted({bucket_of(p).state.value for p in module.parameters()})
                add_hooks(engine)
            out["trace_after"] = coordinator.trace
            out["released_after"] = all(bucket_of(p).state is ParamState.SHARDED or bucket_of(p).persistent
                                        for p in module.parameters())
    out["losses"] = losses
    out["trace_recorded_again"] = coordinator.trace is not None
    out["handles_after"] = len(coordinator.handles)
    return out


def _all_cases(rank: int, world: int) -> dict:
    return {"attrs": _attribute_case(rank),
            "forward_only": {stage: _forward_only_case(rank, stage) for stage in range(4)},
            "generation": _generation_case(rank)}


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return run_distributed(_all_cases, WORLD, timeout=240)


def test_ds_attributes_follow_the_life_cycle(runs: list[dict]) -> None:
    ref = _net()
    for r in runs:
        a = r["attrs"]
        rest = a["at_rest"]
        assert a["is_zero_param"]
        for name, p in ref.named_parameters():
            assert rest[name]["shape"] == tuple(p.shape) and rest[name]["numel"] == p.numel(), name
        # counting through ds_numel gives the model's size (the Trainer's trainable-parameter count)
        assert sum(v["numel"] for v in rest.values()) == sum(p.numel() for p in ref.parameters())
        assert {n: v["status"] for n, v in rest.items()} == {
            "fc1.weight": "NOT_AVAILABLE", "fc1.bias": "NOT_AVAILABLE", "fc2.weight": "NOT_AVAILABLE",
            "fc2.bias": "NOT_AVAILABLE", "norm.weight": "AVAILABLE", "norm.bias": "AVAILABLE"}
        assert [rest[n]["persist"] for n in ("fc1.weight", "norm.weight")] == [False, True]
        assert all(v["active"] == 0 for v in rest.values())
        assert not any(v["external"] for v in rest.values())  # no parameter is another module's external one
        assert len({v["id"] for v in rest.values()}) == len(rest)
        # as fc2's forward starts its parameters are gathered and fc2's unit is the active one
        assert {v["status"] for v in a["in_forward"].values()} == {"AVAILABLE"}
        assert all(v["active"] == 1 for v in a["in_forward"].values())
        assert a["after_backward"]["fc1.weight"] == "NOT_AVAILABLE"
        assert (a["in_flight"], a["gathered"]) == ("INFLIGHT", "AVAILABLE")
        assert set(a["inside_gathered"].values()) == {"AVAILABLE"}
        assert a["released"]["fc1.weight"] == "NOT_AVAILABLE"
        assert all(a["ds_tensor_joins"].values()), a["ds_tensor_joins"]
        assert a["overflow"] is False
    ids = [{n: v["id"] for n, v in r["attrs"]["at_rest"].items()} for r in runs]
    assert ids[0] == ids[1]  # the same numbering on every rank
    # each element of a bucket's shard belongs to exactly one rank's ds_tensor
    total = {n: sum(r["attrs"]["ds_tensor_sizes"][n] for r in runs) for n in ids[0]}
    assert total == {n: p.numel() for n, p in ref.named_parameters()}


@pytest.mark.parametrize("stage", range(4))
def test_engine_without_optimizer(runs: list[dict], stage: int) -> None:
    for r in runs:
        f = r["forward_only"][stage]
        assert f["max_diff"] < 1e-6
        assert f["optimizer"] is None and f["engine_optimizer"] is None and f["scheduler"] is None
        for what, err in zip(("backward", "step"), f["errors"], strict=True):
            assert err is not None, f"engine.{what}() did not raise"
            assert f"engine.{what}()" in err[0] and "without an optimizer" in err[0]
            assert "optimizer=" in err[1]
        mem = f["memory"]
        assert mem["master_params"] == mem["optimizer_states"] == mem["gradients"] == 0
        n = sum(p.numel() for p in _net().parameters())
        if stage == 3:  # each rank: half of every bucket's shard, and the persistent LayerNorm whole too;
            # slots start at multiples of 8 elements, a bucket is a multiple of 2 x 8: fc1 96 + 16 = 112,
            # fc2 64 + 4 -> 80, the norm 4 (+4 padding) + 4 -> 16
            assert mem["params"] == 4 * (112 // 2 + 80 // 2 + 16 // 2 + 16)
            assert f["statuses"] == ["AVAILABLE", "NOT_AVAILABLE"]
        else:
            assert mem["params"] == 4 * n


def test_generation_between_steps_keeps_the_trajectory(runs: list[dict]) -> None:
    ref = _net()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    want, generated = [], None
    for step in range(3):
        x, y = _batch(step)
        opt.zero_grad()
        loss = torch.stack([F.mse_loss(ref(_mine(x, r)), _mine(y, r)) for r in range(WORLD)]).mean()
        loss.backward()
        opt.step()
        want.append(loss.item())
        if step == 0:
            with torch.no_grad():
                generated = ref(x)
    for r in runs:
        g = r["generation"]
        assert g["handles_while_off"] == 0
        assert g["states_after_forward"] == ["gathered"]  # no hook released anything during generation
        assert g["trace_after"] is None  # the gather order is recorded afresh by the next pass
        assert g["released_after"] and g["trace_recorded_again"]
        assert g["handles_after"] > 0
        torch.testing.assert_close(torch.tensor(g["generated"]), generated, rtol=1e-5, atol=1e-6)
    got = [sum(r["generation"]["losses"][s] for r in runs) / WORLD for s in range(3)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-7)
