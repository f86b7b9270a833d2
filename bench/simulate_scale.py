"""`zerorun simulate` across models, worlds and stages: the BENCHMARKS.md table.

    python bench/simulate_scale.py                          # meta mode, 3 models x 3 worlds x 4 stages
    python bench/simulate_scale.py --cpu gpt2-1.5B:512:3    # also CPU mode for these model:world:stage

Each case runs in this process, one after the other (the fake group is created and torn
down per case), rank N-1 of N, two steps, DeepSpeed's stage-3 defaults, bf16 and AdamW.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from zerorun.estimate.counts import human_bytes
from zerorun.simulate import Simulation
from zerorun.simulate.compare import STATE_TERMS, compare, moved_bytes, volume
from zerorun.simulate.model import Decoder, builtin_spec
from zerorun.simulate.run import ModelChoice, SimRequest, default_config, run

MODELS = {"gpt2-1.5B": ("gpt2", 1_500_000_000), "llama-7B": ("llama", 7_000_000_000),
          "llama-70B": ("llama", 70_000_000_000)}


def case(model: str, world: int, stage: int, device: str, steps: int) -> dict:
    family, size = MODELS[model]
    spec = builtin_spec(size, family)  # type: ignore[arg-type]
    cfg = default_config(stage)
    choice = ModelChoice(model, spec.shape, spec.shape.vocab, lambda: Decoder(spec))
    t0 = time.perf_counter()
    result = run(SimRequest(Simulation(world, world - 1, device), choice, cfg, steps=steps))
    est = compare(result, cfg, spec.shape)
    peak = max((p.rss_peak for p in result.phases.values() if p.rss_peak is not None), default=None)
    return {"model": model, "world": world, "stage": stage, "device": device, "psi": result.psi,
            "estimate": sum(est.states.values()), "simulated": sum(result.memory[t] for t in STATE_TERMS),
            "bound": est.bound, "peak": peak,
            "phase_peaks": {k: v.rss_peak for k, v in result.phases.items()},
            "comm": [volume(s) / result.psi for s in result.steps],
            "comm_bytes": [moved_bytes(s) for s in result.steps],
            "estimate_comm": [est.first_step_numel / result.psi, est.later_step_numel / result.psi],
            "setup_psi": volume(result.setup) / result.psi, "setup_bytes": moved_bytes(result.setup),
            "seconds": time.perf_counter() - t0}


def row(r: dict) -> str:
    peak = "-" if r["peak"] is None else human_bytes(r["peak"])
    comm = " / ".join(f"{c:.3f}" for c in r["comm"])
    est_comm = " / ".join(f"{c:.3f}" for c in r["estimate_comm"])
    return (f"| {r['model']} | {r['world']} | {r['stage']} | {r['device']} | {human_bytes(r['estimate'])} | "
            f"{human_bytes(r['simulated'])} | {peak} | {comm} ({human_bytes(r['comm_bytes'][-1])}) | {est_comm} | "
            f"{r['setup_psi']:.3f} ({human_bytes(r['setup_bytes'])}) | {r['seconds']:.0f} |")


HEADER = ("| model | world | stage | mode | estimate: model states | simulated: bookkeeping | physical peak | "
          "comm/step, Ψ (bytes, last) | estimate, Ψ | set-up traffic, Ψ (bytes) | s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", nargs="*", default=[], help="model:world:stage cases to run in CPU mode too")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", help="also write every case's figures to this file")
    args = parser.parse_args(argv)
    cases = [(m, w, s, "meta") for m in args.models for w in (64, 512, 4096) for s in range(4)]
    cases += [(m, int(w), int(s), "cpu") for m, w, s in (c.split(":") for c in args.cpu)]
    print(HEADER, flush=True)
    results = []
    for m, w, s, device in cases:
        results.append(case(m, w, s, device, args.steps))
        print(row(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
