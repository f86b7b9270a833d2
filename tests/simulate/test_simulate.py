"""`zerorun simulate`: the real engine as one rank of 64-4096 on torch's fake group, against the estimate.

Meta mode (no storage): the 70B Llama shape at worlds 512 and 4096, stages 0-3 (the scale the
project checks layout at: a world of 64, below it, cost a minute of the suite; other tests here run 64).

* Model states per rank equal ``estimate``'s to within the bound
  :func:`~zerorun.simulate.compare.model_state_bound` states: per bucket at most one
  element more per sharded term than ceil(Psi/N) spreads (N - 1 per whole term: the
  bucket's padding), the buckets kept whole under the persistence threshold, and Adam's
  4-byte ``step`` per bucket.
* Communication per step is 2 Psi at stages 0-2 and 3 Psi at stage 3 with
  ``stage3_max_reuse_distance`` 0, to within the padding and the persistent buckets
  (re-gathered after each step); with the default reuse distance it is what
  :mod:`zerorun.estimate.stage3_window` replays, element for element.
* Set-up moves at most Psi elements (``zero.Init``'s one broadcast of each module):
  ``initialize`` adopts ``zero.Init``'s shards and gathers only the persistent buckets.
* Set-up never holds more than one module whole (7B and 70B): at every move to the device,
  the unit moving plus every gathered bucket is at most the largest unit.

CPU mode: a 0.31B Llama-shaped model in fp32 (smaller than the 1B of the issue, to keep
CI in seconds on 2 cores: its forward alone is 10 GFLOP), world 512, stage 3 without reuse:
the kernel's resident peak during forward stays within the shards, the gathered
window and the activations.
"""

from __future__ import annotations

import pytest
import torch

from zerorun.estimate.topology import NodeLayout, Stage3Policy
from zerorun.simulate import Simulation, SimulationError, from_env, world
from zerorun.simulate.compare import STATE_TERMS, compare, volume
from zerorun.simulate.model import Decoder, builtin_spec
from zerorun.simulate.run import ModelChoice, SimRequest, default_config, run

LLAMA_70B = builtin_spec(70 * 10**9, "llama")


def _choice(spec) -> ModelChoice:  # noqa: ANN001
    return ModelChoice("llama", spec.shape, spec.shape.vocab, lambda: Decoder(spec))


def _simulate(spec, world_size: int, stage: int, steps: int, rank: int = -1, device: str = "meta",  # noqa: ANN001
              dtype: str = "bf16", resident: bool = True, **zero: int):
    cfg = default_config(stage, dtype)
    cfg["zero_optimization"].update(zero)
    sim = Simulation(world_size, rank % world_size, device)  # type: ignore[arg-type]
    result = run(SimRequest(sim, _choice(spec), cfg, steps=steps, resident=resident))
    return result, compare(result, cfg, spec.shape)


def test_the_70b_shape_is_llama_2_70b() -> None:
    shape = LLAMA_70B.shape
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.ffn) == (8192, 80, 64, 8, 28672)
    assert shape.param_count() == 68_976_648_192


@pytest.mark.parametrize("world_size", [512, 4096])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_70b_model_states_and_traffic_match_the_estimate(stage: int, world_size: int) -> None:
    zero = {"stage3_max_reuse_distance": 0} if stage == 3 else {}
    # the resident walk (a look per large gradient, most of a case's time) runs at world 512; 4096 has the same objects
    result, est = _simulate(LLAMA_70B, world_size, stage, steps=2 if stage == 3 else 1,
                            resident=world_size == 512, **zero)
    psi = result.psi
    assert psi == LLAMA_70B.shape.param_count()
    excess = [result.memory[t] - est.states[t] for t in STATE_TERMS]
    assert all(e >= 0 for e in excess), (excess, est.states)
    assert sum(excess) <= est.bound, (excess, est.bound)
    assert result.memory["optimizer_states"] > 0  # the step was taken (the fake group's sums are never read)
    if result.device_model_state_peak is not None:  # sampled: at its peaks it held at least what it means to hold
        held = result.device_model_state_peak + (result.host_peak or 0)  # (Adam's step counts live on the host)
        assert held >= sum(result.memory[t] for t in STATE_TERMS), (held, result.memory)
    # per step: 2 Psi (stages 0-2), 3 Psi (stage 3, no reuse), plus the buckets' padding (shard and slot
    # alignment) and the norm's scalar; stage 3 less the persistent buckets' two gathers (they stay
    # gathered) plus their refresh
    k, pad = (3 if stage == 3 else 2), result.padding_numel
    for step in result.steps:
        moved = volume(step)
        assert k * psi - result.persistent_numel <= moved <= k * (psi + pad) + 2, moved / psi
    # set-up: zero.Init's one broadcast of each module (stage 3), initialize's broadcast (stages 0-2)
    setup = volume(result.setup)
    assert psi <= setup <= psi + pad + result.persistent_numel, setup / psi
    if stage == 3:  # initialize moved only the persistent buckets: zero.Init's shards were adopted
        assert result.setup["broadcast"]["elements"] <= psi + pad
        assert result.setup["all_gather"]["elements"] == result.persistent_numel
        assert est.first_step_numel == volume(result.steps[0]) - 2  # the estimate's replay, less the norm's scalar
        assert est.later_step_numel == volume(result.steps[1]) - 2


def test_stage3_default_window_keeps_what_the_estimate_replays() -> None:
    spec = builtin_spec(7 * 10**9, "llama")
    result, est = _simulate(spec, 512, 3, steps=2, resident=False)  # traffic and window only
    assert est.window is not None
    assert result.kept_numel == est.window.kept_numel > 0.5e9  # DeepSpeed's default reuse distance keeps ~0.9e9
    assert result.peak_live_numel == est.window.peak_live_numel
    assert volume(result.steps[0]) - 2 == est.first_step_numel  # the norm's scalar all-reduce counts twice
    assert volume(result.steps[1]) - 2 == est.later_step_numel < 2.9 * result.psi


def test_the_last_rank_holds_and_moves_what_rank_0_does() -> None:
    spec = builtin_spec(10**9, "llama")
    first, _ = _simulate(spec, 4096, 3, steps=1, rank=0, resident=False)  # bookkeeping and traffic only
    last, _ = _simulate(spec, 4096, 3, steps=1, rank=4095, resident=False)
    assert last.rank == 4095 and first.rank == 0
    assert last.memory == first.memory
    assert last.steps == first.steps and last.setup == first.setup


def test_simulation_from_the_environment() -> None:
    assert from_env({}) is None
    assert from_env({"ZERORUN_SIMULATE": "512"}) == Simulation(512, 0, "cpu")
    env = {"ZERORUN_SIMULATE": "64", "ZERORUN_SIMULATE_RANK": "63", "ZERORUN_SIMULATE_DEVICE": "META"}
    assert from_env(env) == Simulation(64, 63, "meta")
    for bad, named in [({"ZERORUN_SIMULATE": "lots"}, "ZERORUN_SIMULATE="),
                       ({"ZERORUN_SIMULATE": "8", "ZERORUN_SIMULATE_RANK": "8"}, "rank 8"),
                       ({"ZERORUN_SIMULATE": "8", "ZERORUN_SIMULATE_DEVICE": "cuda"}, "ZERORUN_SIMULATE_DEVICE")]:
        with pytest.raises(SimulationError, match=named) as err:
            from_env(bad)
        assert err.value.hint


def test_init_distributed_joins_the_simulated_world(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from zerorun.engine.comm.bootstrap import init_distributed
    from zerorun.engine.comm.collectives import Collectives

    monkeypatch.setenv("ZERORUN_SIMULATE", "256")
    monkeypatch.setenv("ZERORUN_SIMULATE_RANK", "17")
    monkeypatch.setenv("ZERORUN_SIMULATE_DEVICE", "meta")
    try:
        ctx = init_distributed()
        assert (ctx.rank, ctx.world_size, ctx.backend, ctx.device.type) == (17, 256, "fake", "meta")
        coll = Collectives(ctx.group, ctx.world_size, ctx.rank)
        assert coll.simulated and coll.native_reduce_scatter and coll.device.type == "meta"
        assert not coll.open_shared_lane(1024)  # the shared-memory lane stays closed
        with pytest.raises(AssertionError, match="undefined"):
            coll.all_true(True)  # a decision on a value the fake group does not compute
    finally:
        dist.destroy_process_group()


def test_one_world_per_process() -> None:
    with world(4, rank=1), pytest.raises(SimulationError, match="already exists"), world(8):
        pass


def test_cpu_forward_peak_stays_within_shards_window_and_activations() -> None:
    from zerorun.estimate import ActivationPolicy, Dtype, activation_bytes

    spec = builtin_spec(3 * 10**8, "llama")
    cfg_window = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}
    torch.set_num_threads(1)
    result, est = _simulate(spec, 512, 3, steps=1, device="cpu", dtype="fp32", **cfg_window)
    forward = result.phases["forward"]
    assert forward.rss_peak is not None and forward.rss_start is not None
    rise = forward.rss_peak - forward.rss_start
    window = max(est.window.peak_live_numel if est.window else 0, spec.shape.largest_unit()) * 4  # fp32
    activations = activation_bytes(spec.shape, Dtype.FP32, ActivationPolicy())
    allowance = window + activations + 64 * 2**20  # + the allocator's and the interpreter's slack
    assert rise <= allowance, f"forward rose {rise / 2**20:.0f} MiB, allowed {allowance / 2**20:.0f} MiB"


@pytest.mark.parametrize("size", [7 * 10**9, 70 * 10**9])
def test_setup_holds_one_module_whole_at_a_time(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from zerorun.engine.mechanism.partition import PartitionedBucket
    from zerorun.engine.mechanism.placement import watch_moves

    made: list[PartitionedBucket] = []
    orig_init = PartitionedBucket.__init__

    def recording_init(self, *args, **kwargs):  # noqa: ANN001, ANN202
        orig_init(self, *args, **kwargs)
        made.append(self)

    whole: list[int] = []  # elements whole at each set-up move: the unit moving + every gathered bucket

    def observe(tensors: list[torch.Tensor], device: torch.device) -> None:
        gathered = sum(b.live_numel for b in made if not b.persistent)
        whole.append(gathered + sum(t.numel() for t in tensors))

    monkeypatch.setattr(PartitionedBucket, "__init__", recording_init)
    spec = builtin_spec(size, "llama")
    with watch_moves(observe):  # set-up alone: a step moves nothing to the device (the same moves with 0 or 1 steps)
        result, _ = _simulate(spec, 512, 3, steps=0)
    assert len(whole) >= len(made) > 0
    assert max(whole) <= spec.shape.largest_unit(), (max(whole), spec.shape.largest_unit())
    assert result.setup["all_gather"]["elements"] == result.persistent_numel  # nothing re-gathered at initialize


def _links(spec, layout: NodeLayout, policies: list[Stage3Policy]):  # noqa: ANN001, ANN202
    """One simulated run (MiCS: as a rank of its shard group) compared under each of ``policies``."""
    shard = policies[0].shard_size(layout)
    cfg = default_config(3)
    cfg["zero_optimization"]["stage3_max_reuse_distance"] = 2 * 10**7  # a window smaller than the model
    result = run(SimRequest(Simulation(shard, shard - 1, "meta"), _choice(spec), cfg, steps=2))
    return result, [compare(result, cfg, spec.shape, layout, p).links for p in policies]


def test_per_link_bytes_equal_the_estimate_under_each_policy() -> None:
    """The engine's per-phase counters, split by node (8 GPUs each), equal the estimate's replay exactly."""
    spec, layout = builtin_spec(3 * 10**8, "llama"), NodeLayout(64, 8)
    plain = [Stage3Policy(), Stage3Policy(hpz=8), Stage3Policy(qwz=True)]
    _, projected = _links(spec, layout, plain)
    mics_result, [mics] = _links(spec, layout, [Stage3Policy(mics=16)])
    for links in [*projected, mics]:
        assert links is not None
        assert links.steps[0] == links.estimate.first_step
        assert links.steps[1] == links.estimate.later_steps
        assert links.secondary_bytes == links.estimate.secondary_bytes
    _, hpz, qwz = projected
    assert hpz.steps[1]["backward_all_gather"].across == 0 < hpz.steps[1]["backward_all_gather"].inside
    assert hpz.secondary_bytes > 0
    assert qwz.steps[1]["forward_all_gather"].across < projected[0].steps[1]["forward_all_gather"].across * 0.51
    assert mics.steps[1]["replica_all_reduce"].across > 0
    states = sum(mics_result.memory[t] for t in STATE_TERMS)
    assert mics_result.world_size == 16 and states >= sum(mics.estimate.model_states.values())
