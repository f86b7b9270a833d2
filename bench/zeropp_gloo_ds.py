"""DeepSpeed's side of ``bench/zeropp_gloo.py``: the same job under DeepSpeed (one rank; run by torchrun).

    torchrun --nproc_per_node 4 bench/zeropp_gloo_ds.py '{"zero_hpz_partition_size": 2}'

Prints ``BENCH_RESULT {...}`` on rank 0: the median step time over the ranks' medians and the last
loss. Its bytes are not counted: DeepSpeed's ``deepspeed.comm`` holds torch's collectives from
before ``bench/comm_count.py`` could wrap them (the count read 16 bytes a step). DeepSpeed 0.19.8
refuses MiCS's keys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common as C  # noqa: E402


def main() -> None:
    import deepspeed

    keys = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    args = argparse.Namespace(hidden=256, layers=8, ffn_mult=4, seed=1234, global_batch=64, steps=10, warmup=3)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    cfg = {"train_batch_size": args.global_batch, "train_micro_batch_size_per_gpu": args.global_batch // world,
           "gradient_clipping": 0.0, "steps_per_print": 10**9, "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0, **keys}}
    model = C.build_model(args)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=C.make_adamw(model.parameters()), config=cfg,
                                           dist_init_required=False)
    times = []
    for s in range(args.steps):
        x, y = C.get_batch(args, s, rank, world)
        dist.barrier()
        start = time.perf_counter()
        loss = C.loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
    medians = [None] * world
    dist.all_gather_object(medians, statistics.median(times[args.warmup:]))
    if rank == 0:
        print(C.RESULT_PREFIX + json.dumps({"keys": keys, "step_s": statistics.median(medians),
                                            "loss": float(loss.detach())}), flush=True)


if __name__ == "__main__":
    main()
