"""How many threads each rank's torch may start (``OMP_NUM_THREADS``), as torchrun decides it.

A torch process starts one intra-op thread per core it can see. N ranks on one node
would each start all of them: N times oversubscribed, which on CPU ranks costs 5-30x
in step time (BENCHMARKS.md, "The first hour"). So, as torchrun does, a rank whose
environment does not set ``OMP_NUM_THREADS`` gets its share of the node's cores (at
least 1); ``--threads_per_rank N`` chooses the number instead; a user's
``OMP_NUM_THREADS`` is left alone. The launcher says once which rule applied.

Binding ranks to cores (``--bind_cores_to_rank``) stays opt-in: on a machine shared
with other jobs it measured slower than the threads limit alone (BENCHMARKS.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan

VAR = "OMP_NUM_THREADS"


def node_cores() -> int:
    """The cores this process may run on (its affinity mask, as torch itself counts them)."""
    return len(os.sched_getaffinity(0))


def threads_for(env: Mapping[str, str], threads_per_rank: int | None, local_world: int,
                cores: int, bound_share: int | None = None) -> str | None:
    """The ``OMP_NUM_THREADS`` to give a rank, or None to leave its environment as it is.

    ``bound_share`` is the rank's core count under ``--bind_cores_to_rank``.
    """
    if threads_per_rank is not None:
        return str(threads_per_rank)
    if bound_share is not None:  # --bind_cores_to_rank: the threads of the cores it pins (DeepSpeed's rule)
        return str(bound_share)
    if env.get(VAR, "").strip():
        return None
    return str(max(1, cores // max(1, local_world)))


def threads_per_rank_arg(text: str) -> int:
    """``--threads_per_rank``'s type: a whole number of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise LaunchError(f"--threads_per_rank {text!r}: a rank needs a whole number of threads, at least 1",
                          "give 1 or more, or leave it out for each rank's share of the cores")
    return int(text)


def say_threads(plan: LaunchPlan, local: bool) -> None:
    """Print, once per launch, how many threads the ranks get."""
    env = {**os.environ, **dict(plan.env)}
    note = threads_note(env, plan.options.threads_per_rank, [len(n.ranks) for n in plan.nodes], local,
                        node_cores(), plan.options.bind_cores)
    print(note, file=sys.stderr, flush=True)


def threads_note(env: Mapping[str, str], threads_per_rank: int | None, local_worlds: list[int],
                 local: bool, cores: int, bind: bool = False) -> str:
    """The one line the launcher prints about the ranks' threads."""
    if threads_per_rank is not None:
        return f"zerorun: {VAR}={threads_per_rank} for every rank (--threads_per_rank)"
    if bind:
        return f"zerorun: {VAR} = the rank's share of the cores it is bound to (--bind_cores_to_rank)"
    if env.get(VAR, "").strip():
        return f"zerorun: {VAR}={env[VAR].strip()} for every rank (from your environment)"
    if local:
        n = local_worlds[0]
        return (f"zerorun: {VAR}={max(1, cores // max(1, n))} for each of the {n} ranks ({cores} cores / {n} ranks); "
                f"set {VAR} or --threads_per_rank N to choose")
    return (f"zerorun: {VAR} = each node's cores / its ranks (at least 1) for every rank; "
            f"set {VAR} or --threads_per_rank N to choose")
