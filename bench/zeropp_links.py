"""ZeRO++/MiCS per-link figures of `zerorun simulate` against the estimate (the BENCHMARKS.md table).

    python bench/zeropp_links.py                      # Llama 2 70B, world 512, 8 GPUs per node, bf16, meta
    python bench/zeropp_links.py --params 7B --world 64

One simulated run per policy (plain, hpZ 8, qwZ, MiCS 64); each row is the later step's
bytes per rank, simulated = estimate (asserted), and the text form is checked to carry
the same figures as the JSON.
"""

from __future__ import annotations

import argparse

from zerorun.estimate import parse_param_count
from zerorun.estimate.counts import human_bytes
from zerorun.estimate.topology import Link, NodeLayout, Stage3Policy
from zerorun.simulate import Simulation
from zerorun.simulate.compare import STATE_TERMS, compare
from zerorun.simulate.model import Decoder, builtin_spec
from zerorun.simulate.report import render, to_json
from zerorun.simulate.run import ModelChoice, SimRequest, default_config, run

POLICIES = {"plain": Stage3Policy(), "hpZ 8": Stage3Policy(hpz=8), "qwZ": Stage3Policy(qwz=True),
            "MiCS 64": Stage3Policy(mics=64)}


def one(params: str, world: int, per_node: int, policy: Stage3Policy) -> dict:
    spec = builtin_spec(parse_param_count(params), "llama", 16, 1)
    choice = ModelChoice(params, spec.shape, spec.shape.vocab, lambda: Decoder(spec))
    layout = NodeLayout(world, per_node)
    shard = policy.shard_size(layout)
    cfg = default_config(3)
    result = run(SimRequest(Simulation(shard, 0, "meta"), choice, cfg, 2, 16))
    comparison = compare(result, cfg, spec.shape, layout, policy)
    links = comparison.links
    assert links is not None
    sim, est = links.steps[-1], links.estimate.later_steps
    assert sim == est, (sim, est)
    assert links.secondary_bytes == links.estimate.secondary_bytes
    doc, text = to_json(result, comparison), "\n".join(render(result, comparison))
    assert doc["communication"]["by_link"]["simulated"]["steps"][-1]["backward_all_gather"] == {
        "inside": sim["backward_all_gather"].inside, "across": sim["backward_all_gather"].across}
    assert human_bytes(sim["forward_all_gather"].across) in text
    total = sum(sim.values(), Link())
    return {"psi": result.psi, "fwd": sim["forward_all_gather"], "bwd": sim["backward_all_gather"],
            "rs": sim["reduce_scatter"], "rep": sim["replica_all_reduce"], "total": total,
            "secondary": links.secondary_bytes, "states": sum(result.memory[t] for t in STATE_TERMS),
            "est_states": sum(comparison.states.values())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="70B")
    ap.add_argument("--world", type=int, default=512)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    a = ap.parse_args()
    print("| policy | fwd all-gather across | bwd all-gather across | reduce-scatter across | replica all-reduce "
          "across | total inside / across | hpZ copy | model states sim / est |")
    print("|---|---|---|---|---|---|---|---|")
    for name, policy in POLICIES.items():
        r = one(a.params, a.world, a.gpus_per_node, policy)
        h = human_bytes
        print(f"| {name} | {h(r['fwd'].across)} | {h(r['bwd'].across)} | {h(r['rs'].across)} | {h(r['rep'].across)} | "
              f"{h(r['total'].inside)} / {h(r['total'].across)} | {h(r['secondary'])} | "
              f"{h(r['states'])} / {h(r['est_states'])} |", flush=True)


if __name__ == "__main__":
    main()
