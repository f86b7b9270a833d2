"""hpZ and MiCS (DeepSpeed's ``zero_hpz_partition_size``, ``mics_shard_size``, ``mics_hierarchical_params_gather``)
on gloo/CPU: world 4 trains as one process does, and each collective goes over the group the policy says.

The ranks play nodes of ``LOCAL_WORLD_SIZE`` ranks on one host (the engine reads the node layout from it):

* hpZ 2 in nodes of 2: forward gathers over the world, backward over the node's pair only;
* MiCS 2 in nodes of 2: two shard groups of two (one per node), gradients summed across them;
* MiCS 2, hierarchical, in nodes of 1: each shard group spans two "nodes", the gather's first hop
  crosses them, the second is a node's own (of one);
* MiCS 4, hierarchical, in nodes of 2: one shard group, both hops of two ranks.

Every layout runs in the one spawned world-4 group (the groups are created per engine); the
tolerances are the stage-3 parity suite's (fp32: losses and parameters rtol 1e-5).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.dist_harness import assert_matches_reference, run_distributed
from tests.engine.test_engine_stage3_cases import (
    STEPS,
    Case,
    global_batch,
    loss_fn,
    make_model,
    reference,
    train_case,
)

WORLD = 4
LAYOUTS = {  # name: (LOCAL_WORLD_SIZE, zero_optimization keys)
    "hpz2": (2, {"zero_hpz_partition_size": 2}),
    "mics2": (2, {"mics_shard_size": 2}),
    "mics2-hier": (1, {"mics_shard_size": 2, "mics_hierarchical_params_gather": True}),
    "mics4-hier": (2, {"mics_shard_size": 4, "mics_hierarchical_params_gather": True}),
}
CASES = [Case("mlp", "fp32", 1, False, False), Case("mlp", "fp32", 3, True, False, sgd=True),
         Case("gpt", "fp32", 1, True, False, sgd=True)]


def _config(case: Case, keys: dict) -> dict:
    cfg = case.config()
    cfg["zero_optimization"].update(keys)
    return cfg


def _phase_counts(rank: int, world: int, keys: dict) -> dict:
    """One step of the toy MLP, the collectives of each group counted per phase (forward, backward, step)."""
    import zerorun

    case = Case("mlp", "fp32", 1, False, False)
    model = make_model(case.model)
    engine, _, _, _ = zerorun.initialize(model=model, config=_config(case, keys))
    x, y = global_batch(case.model, 0, 4 * world)
    rows = slice(4 * rank, 4 * rank + 4)

    def snap() -> dict:
        return {g: {k: int(v["elements"]) for k, v in c.items()} for g, c in engine.comm_stats_by_group().items()}

    marks = [snap()]
    loss = loss_fn(case.model, engine(x[rows]), y[rows])
    marks.append(snap())
    secondary_after_forward = sum(b.routes.held_bytes() for b in engine.parts.buckets)
    params_after_forward = engine.memory_breakdown()["params"]
    engine.backward(loss)
    marks.append(snap())
    engine.step()
    marks.append(snap())
    phases = {}
    for name, a, b in zip(("forward", "backward", "step"), marks, marks[1:], strict=False):
        phases[name] = {g: {k: b[g][k] - a[g][k] for k in b[g]} for g in b}
    buckets = engine.parts.buckets
    return {"phases": phases, "padded": sum(b.plan.padded_numel for b in buckets),
            "shard_numel": sum(b.shard_numel for b in buckets),
            "secondary_after_step": sum(b.routes.held_bytes() for b in buckets),
            "secondary_after_forward": secondary_after_forward, "params_after_forward": params_after_forward,
            "params_after_step": engine.memory_breakdown()["params"],
            "total": {k: int(v["elements"]) for k, v in engine.comm_stats().items()},
            "by_group_total": {k: sum(int(c[k]["elements"]) for c in engine.comm_stats_by_group().values())
                               for k in engine.comm_stats()}}


def _checkpoints(rank: int, world: int, root: str) -> dict:
    """Save under MiCS 2 and under hpZ 2, load each into plain stage 3 (and plain into MiCS 2): same parameters."""
    import zerorun

    case = Case("mlp", "fp32", 1, False, False)
    out = {}
    for name, keys in (("mics2", {"mics_shard_size": 2}), ("hpz2", {"zero_hpz_partition_size": 2}), ("plain", {})):
        model = make_model(case.model)
        engine, _, _, _ = zerorun.initialize(model=model, config=_config(case, keys))
        for step in range(2):
            x, y = global_batch(case.model, step, 4 * world)
            engine.backward(loss_fn(case.model, engine(x[4 * rank:4 * rank + 4]), y[4 * rank:4 * rank + 4]))
            engine.step()
        engine.save_checkpoint(os.path.join(root, name), tag="t")
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            out[f"{name}-saved"] = [p.detach().clone() for p in model.parameters()]
    for src, dst_keys in (("mics2", {}), ("hpz2", {}), ("plain", {"mics_shard_size": 2})):
        model = make_model(case.model, seed=99)  # other weights: the load must replace them all
        engine, _, _, _ = zerorun.initialize(model=model, config=_config(case, dst_keys))
        engine.load_checkpoint(os.path.join(root, src), tag="t")
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            out[f"{src}-loaded"] = [p.detach().clone() for p in model.parameters()]
        x, y = global_batch(case.model, 5, 4 * world)  # and it trains on from there: one more step, a finite loss
        loss = loss_fn(case.model, engine(x[4 * rank:4 * rank + 4]), y[4 * rank:4 * rank + 4])
        engine.backward(loss)
        engine.step()
        out[f"{src}-next-loss"] = float(loss)
    return out


def _load_at(rank: int, world: int, root: str) -> dict:
    """A world-2 run loads the world-4 MiCS and hpZ checkpoints (plain stage 3) and a world-2 MiCS 1... (none)."""
    import zerorun

    case = Case("mlp", "fp32", 1, False, False)
    out = {}
    for src in ("mics2", "hpz2"):
        model = make_model(case.model, seed=99)
        engine, _, _, _ = zerorun.initialize(model=model, config=_config(case, {}))
        engine.load_checkpoint(os.path.join(root, src), tag="t")
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            out[src] = [p.detach().clone() for p in model.parameters()]
    return out


def _zero_init(rank: int, world: int) -> dict:
    """Models built under DeepSpeed's ``zero.Init`` / ``MiCS_Init`` with hpZ and MiCS configs train at parity."""
    import torch.distributed as dist

    from zerorun.compat.zero_init import Init, MiCS_Init
    from zerorun.engine.mechanism.partition import bucket_of
    from zerorun.errors import UnsupportedFeature

    case = Case("mlp", "fp32", 1, False, False)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both, in one order
    out: dict = {}
    for name, keys, cls, kwargs in (
            ("mics2", {"mics_shard_size": 2}, MiCS_Init, {}),
            ("hpz2", {"zero_hpz_partition_size": 2}, Init, {"zero_param_parallel_group": pairs[rank // 2]})):
        cfg = _config(case, keys)
        with cls(config_dict_or_path=cfg, **kwargs):
            model = make_model(case.model)
        out[f"{name}-sharded-over"] = bucket_of(model.fc1.weight).coll.world_size
        out[name] = train_case(case, rank, world, model=model, config=cfg)
    try:  # the world is not the config's hpZ group
        Init(config_dict_or_path=_config(case, {"zero_hpz_partition_size": 2}), zero_param_parallel_group=pairs[0]
             if rank >= 2 else pairs[1])
        out["wrong-group"] = "accepted"
    except UnsupportedFeature as e:
        out["wrong-group"] = str(e)
    return out


TOY_HIDDEN, TOY_LAYERS, TOY_MICRO, TOY_STEPS = 16, 3, 2, 4


def _toy_setup() -> tuple[torch.nn.Module, torch.Tensor]:
    from examples.train_toy import ToyMLP

    torch.manual_seed(1234)  # the example's own seeding and teacher
    model = ToyMLP(TOY_HIDDEN, TOY_LAYERS)
    teacher = torch.randn(TOY_HIDDEN, TOY_HIDDEN, generator=torch.Generator().manual_seed(7)) / TOY_HIDDEN ** 0.5
    return model, teacher


def _toy(rank: int, world: int, keys: dict) -> dict:
    """The loop of ``examples/train_toy.py`` (its ToyMLP, batches and loss), AdamW from the config."""
    import torch.nn.functional as F

    import zerorun
    from examples.train_toy import batch

    model, teacher = _toy_setup()
    cfg = {"train_micro_batch_size_per_gpu": TOY_MICRO, "gradient_clipping": 0.0, "steps_per_print": 10**6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "stage3_max_reuse_distance": 0, **keys}}
    engine, _, _, _ = zerorun.initialize(model=model, config=cfg)
    losses = []
    for step in range(TOY_STEPS):
        x, y = batch(step, rank, world, TOY_MICRO, TOY_HIDDEN, teacher)
        loss = F.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}


def _toy_reference(world: int) -> tuple[list[float], list[torch.Tensor]]:
    import torch.nn.functional as F

    from examples.train_toy import batch

    model, teacher = _toy_setup()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for step in range(TOY_STEPS):
        x, y = batch(step, 0, 1, TOY_MICRO * world, TOY_HIDDEN, teacher)  # the global batch: every rank's rows
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, [p.detach().clone() for p in model.parameters()]


def _all(rank: int, world: int, root: str) -> dict:
    out: dict = {}
    for name, (per_node, keys) in LAYOUTS.items():
        os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
        out[name] = {case.name: train_case(case, rank, world, config=_config(case, keys)) for case in CASES}
        out[name]["counts"] = _phase_counts(rank, world, keys)
        out[name]["toy"] = _toy(rank, world, keys)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    out["checkpoints"] = _checkpoints(rank, world, root)
    out["zero_init"] = _zero_init(rank, world)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zeropp")


@pytest.fixture(scope="module")
def runs(root: Path) -> list[dict]:
    return run_distributed(_all, WORLD, str(root), timeout=420)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_world4_trains_as_one_process(runs: list[dict], layout: str, case: Case) -> None:
    ref_losses, ref_params = reference(case, WORLD)
    per_rank = [r[layout][case.name] for r in runs]
    assert_matches_reference(case, WORLD, per_rank, STEPS, ref_losses, ref_params)
    for r in per_rank:
        assert r["states_after"] in ([], ["sharded"]), r["states_after"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_toy_example_loop_trains_as_one_process(runs: list[dict], layout: str) -> None:
    """examples/train_toy.py's loop at world 4: losses within 1e-5, parameters within 1e-4 of one process."""
    ref_losses, ref_params = _toy_reference(WORLD)
    for rank, r in enumerate(runs):
        toy = r[layout]["toy"]
        # the step's loss is the mean of the ranks' micro-batch losses (equal micro-batches)
        losses = [sum(q[layout]["toy"]["losses"][s] for q in runs) / WORLD for s in range(TOY_STEPS)]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-7)
        for got, want in zip(toy["params"], ref_params, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=lambda m, rank=rank: f"[rank {rank}] {m}")
    assert ref_losses[-1] < ref_losses[0]  # it learns: the comparison is not of untouched weights


def test_hpz_backward_gathers_over_the_node_pair_only(runs: list[dict]) -> None:
    for r in runs:
        c = r["hpz2"]["counts"]
        fwd, bwd = c["phases"]["forward"], c["phases"]["backward"]
        assert set(r["hpz2"]["counts"]["phases"]["forward"]) == {"world", "secondary"}
        assert fwd["world"]["all_gather"] == c["padded"] and fwd["secondary"]["all_gather"] == 0
        assert bwd["world"]["all_gather"] == 0, "backward gathered over the world"
        assert bwd["secondary"]["all_gather"] == c["padded"]  # every unit was released after its forward
        assert bwd["world"]["reduce_scatter"] == c["padded"]  # gradients: the world, as plain stage 3
        assert c["secondary_after_step"] == 0  # the step drops the (stale) secondary copies
        # after forward every unit holds its node-pair chunk (half the padded unit, fp32), counted as parameters
        assert c["secondary_after_forward"] == c["padded"] // 2 * 4
        assert c["params_after_forward"] - c["params_after_step"] == c["secondary_after_forward"]
        assert c["total"] == c["by_group_total"]  # comm_stats() is every group's counts together


@pytest.mark.parametrize("layout", ["mics2", "mics2-hier"])
def test_mics_shards_inside_the_group_and_sums_across_replicas(runs: list[dict], layout: str) -> None:
    for r in runs:
        c = r[layout]["counts"]
        phases = c["phases"]
        world = {k: sum(p["world"][k] for p in phases.values()) for k in ("all_gather", "reduce_scatter")}
        assert world == {"all_gather": 0, "reduce_scatter": 0}, "MiCS gathered or reduced over the world"
        bwd = phases["backward"]
        assert bwd["shard"]["reduce_scatter"] == c["padded"]
        assert bwd["replica"]["all_reduce"] == c["shard_numel"]  # the gradient shard, once, at the boundary
        assert c["shard_numel"] == c["padded"] // 2
        # forward and backward gather every unit: over the shard group, or (hierarchical, a shard group
        # spanning two nodes of one rank) first across the nodes, then each node's own rank
        gathered = "inter" if layout.endswith("hier") else "shard"
        assert sum(p[gathered]["all_gather"] for p in phases.values()) == 2 * c["padded"]
        if layout.endswith("hier"):
            assert sum(p["shard"]["all_gather"] for p in phases.values()) == 0


def test_mics4_hierarchical_gathers_in_two_hops(runs: list[dict]) -> None:
    for r in runs:
        c = r["mics4-hier"]["counts"]
        fwd = c["phases"]["forward"]
        assert fwd["inter"]["all_gather"] == c["padded"] // 2  # [node][place]: this place's column, 2 chunks
        assert fwd["intra"]["all_gather"] == c["padded"]  # each node's row, 2 rows
        assert fwd.get("shard", fwd["world"])["all_gather"] == 0


def test_checkpoints_cross_hpz_mics_and_plain_stage3(runs: list[dict]) -> None:
    for r in runs:
        ck = r["checkpoints"]
        for src in ("mics2", "hpz2", "plain"):
            for got, want in zip(ck[f"{src}-loaded"], ck[f"{src}-saved"], strict=True):
                assert torch.equal(got, want), src
            assert torch.isfinite(torch.tensor(ck[f"{src}-next-loss"]))


def test_checkpoints_saved_at_world4_load_at_world2(runs: list[dict], root: Path) -> None:
    saved = runs[0]["checkpoints"]
    for r in run_distributed(_load_at, 2, str(root), timeout=240):
        for src in ("mics2", "hpz2"):
            for got, want in zip(r[src], saved[f"{src}-saved"], strict=True):
                assert torch.equal(got, want), src


@pytest.mark.parametrize("layout", ["mics2", "hpz2"])
def test_zero_init_builds_for_hpz_and_mics(runs: list[dict], layout: str) -> None:
    """DeepSpeed's ``MiCS_Init(config_dict_or_path=...)`` shards inside the MiCS group from the start;
    ``Init(zero_param_parallel_group=...)`` takes the config's hpZ group; both then train at parity."""
    case = Case("mlp", "fp32", 1, False, False)
    ref_losses, ref_params = reference(case, WORLD)
    assert_matches_reference(case, WORLD, [r["zero_init"][layout] for r in runs], STEPS, ref_losses, ref_params)
    for r in runs:
        assert r["zero_init"][f"{layout}-sharded-over"] == (2 if layout == "mics2" else WORLD)
        assert "zero_param_parallel_group that is not the config's hpZ group" in r["zero_init"]["wrong-group"]


def _under_nccl_policy(rank: int, world: int) -> dict:
    """The layouts with the NCCL policy on gloo: native all-gathers and reduce-scatters on the subgroups,
    every asynchronous buffer poisoned until its wait(), every tensor's device checked."""
    from zerorun.engine.comm.checks import CHECK_ENV

    os.environ[CHECK_ENV] = "native,deferred,device"
    case = CASES[1]  # accumulation 3 and prefetch: gathers in flight ahead of use
    out = {}
    for name, (per_node, keys) in LAYOUTS.items():
        os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
        out[name] = train_case(case, rank, world, config=_config(case, keys))
    return out


def test_the_layouts_under_the_nccl_policy_with_deferred_buffers() -> None:
    case = CASES[1]
    ref_losses, ref_params = reference(case, WORLD)
    results = run_distributed(_under_nccl_policy, WORLD, timeout=300)
    for name in LAYOUTS:
        assert_matches_reference(case, WORLD, [r[name] for r in results], STEPS, ref_losses, ref_params)
