"""One system of the benchmark, on every rank of one torchrun job; rank 0 prints one JSON line.

    torchrun --standalone --nproc_per_node 2 bench/run_system.py --system zerorun-z2

Systems: zerorun-z0/z1/z2/z3 (every knob but the stage at its default), zerorun-z2/z3-offload
(``offload_optimizer: cpu``, the config's AdamW: torch's fused CPU kernel), zerorun-z3-reshard
(stage 3 freeing each unit after its forward and re-gathering it for backward, as FSDP2's
default ``reshard_after_forward=True`` does), torch-ddp, torch-zero-optim (DDP + ZeroRedundancyOptimizer),
torch-fsdp2 (fully_shard per block, the head, then the root), ds-z0/z1/z2/z3 (DeepSpeed with
the same torch AdamW as a client optimizer; needs ``deepspeed`` and DS_ACCELERATOR=cpu on CPU),
ds-z1/z2/z3-offload (``offload_optimizer: cpu`` with the config's AdamW: DeepSpeedCPUAdam, its JIT-built
AVX kernel, as shared/peers' ``--offload`` runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comm_count  # noqa: E402
import common as C  # noqa: E402

Batch = list[tuple[torch.Tensor, torch.Tensor]]  # one optimizer step: ``--gas`` micro-batches
Step = Callable[[Batch], torch.Tensor]


def _engine_step(engine: Any, batches: Batch) -> torch.Tensor:
    """One optimizer step of a DeepSpeed-shaped engine (zerorun's or DeepSpeed's): the mean micro-batch loss."""
    losses = []
    for x, y in batches:
        loss = C.loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


# the peers' AdamW as a config block (a config optimizer, not a client one: the engine picks its kernel)
ADAMW_BLOCK = {"type": "AdamW", "params": {"lr": C.LR, "betas": list(C.BETAS), "eps": C.EPS,
                                           "weight_decay": C.WEIGHT_DECAY}}


def stage_of(system: str) -> int:
    """``zerorun-z2-offload`` -> 2, ``ds-z3`` -> 3."""
    return int(system.split("-z", 1)[1][0])


def zerorun_config(args, world: int) -> dict[str, Any]:
    """The zerorun config of ``args.system`` (``zerorun-z<stage>[-variant]``): every knob but the stage at its default."""
    zero: dict[str, Any] = {"stage": stage_of(args.system)}  # every other knob at its default ...
    if args.bucket is not None:  # ... unless the command line sets it
        zero["reduce_bucket_size"] = args.bucket
    if args.overlap is not None:
        zero["overlap_comm"] = args.overlap == "true"
    cfg = {"train_micro_batch_size_per_gpu": args.global_batch // world, "gradient_accumulation_steps": args.gas,
           "gradient_clipping": 0.0,  # the peers do not clip: keep parity whatever the default is
           "steps_per_print": 10**9, "zero_optimization": zero}
    if args.system.endswith("-offload"):  # the config's AdamW: the engine builds the host step's kernel
        zero["offload_optimizer"] = {"device": "cpu"}
        cfg["optimizer"] = ADAMW_BLOCK
    if args.system == "zerorun-z3-reshard":  # FSDP2-like: free after forward (reuse 0), ~2 units prefetched
        cfg["zero_optimization"].update(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=args.prefetch,
                                        stage3_max_live_parameters=4 * args.prefetch)
    return cfg


def setup_zerorun(args, model, world: int, cfg: dict[str, Any] | None = None
                  ) -> tuple[Step, Callable[[], int], Callable[[], list[torch.Tensor]], Any]:
    """``cfg``: the config ``model`` was built under (``zero.Init``), else :func:`zerorun_config`'s."""
    import zerorun

    cfg = cfg or zerorun_config(args, world)
    trainable = [p for p in model.parameters() if p.requires_grad]  # frozen bases are not stepped
    client = None if "optimizer" in cfg else C.make_adamw(trainable)
    engine, _, _, _ = zerorun.initialize(model=model, optimizer=client, config=cfg)

    def step(batches: Batch) -> torch.Tensor:
        return _engine_step(engine, batches)

    def comm_bytes() -> int:
        return sum(int(row["bytes"]) * (2 if kind == "all_reduce" else 1)
                   for kind, row in engine.comm_stats().items())

    def full_params() -> list[torch.Tensor]:  # stage 3 holds shards: gather (a no-op at stages 0-2)
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            return [p.detach().clone() for p in model.parameters()]

    try:
        from zerorun.engine.metrics import model_state_bytes
    except ImportError:  # an A/B arm of an older checkout (bench/compare.py --ab-path): the module's old name
        from zerorun.engine.figures import model_state_bytes

    return step, lambda: model_state_bytes(engine.memory_breakdown()), full_params, comm_bytes


def setup_torch(args, model, world: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    ddp_bytes = 2 * 4 * numel  # DDP's all-reduce of every fp32 gradient, per step (analytic)
    comm_count.install()
    if args.system == "torch-fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model.head, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped, opt, per_step_extra = model, C.make_adamw(model.parameters()), 0
    elif args.system == "torch-zero-optim":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        wrapped = DDP(model)
        opt = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.AdamW, lr=C.LR,
                                      betas=C.BETAS, eps=C.EPS, weight_decay=C.WEIGHT_DECAY, foreach=False)
        per_step_extra = ddp_bytes
    else:
        wrapped, opt, per_step_extra = DDP(model), C.make_adamw(model.parameters()), ddp_bytes
    steps = {"n": 0, "bytes": 0}
    fsdp = args.system == "torch-fsdp2"

    def micro_step(x: torch.Tensor, y: torch.Tensor, sync: bool) -> torch.Tensor:
        """Accumulation as the torch docs do it: no gradient sync before the last micro-batch. DDP's
        ``no_sync`` must cover the forward too: the forward is where DDP arms its reducer."""
        if fsdp:
            model.set_requires_gradient_sync(sync)
        context = contextlib.nullcontext() if sync or fsdp else wrapped.no_sync()
        with context:
            loss = C.loss_fn(wrapped(x), y)
            (loss if args.gas == 1 else loss / args.gas).backward()
        return loss

    def step(batches: Batch) -> torch.Tensor:
        before = comm_count.TOTAL["bytes"]
        opt.zero_grad(set_to_none=fsdp)
        losses = []
        for k, (x, y) in enumerate(batches):
            loss = micro_step(x, y, sync=k == len(batches) - 1)
            losses.append(loss.detach())
        opt.step()
        steps["n"] += 1
        steps["bytes"] += comm_count.TOTAL["bytes"] - before
        return torch.stack(losses).mean()

    inner = opt.optim if hasattr(opt, "optim") else opt

    def state() -> int:
        ps = list(model.parameters())
        return C.tensor_bytes_dedup(ps + [p.grad for p in ps] + C.optimizer_state_tensors(inner))

    def full_params() -> list[torch.Tensor]:
        return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]

    return step, state, full_params, lambda: steps["bytes"] + per_step_extra * steps["n"]


def setup_deepspeed(args, model, world: int):
    import deepspeed

    comm_count.install()
    cfg = {"train_batch_size": args.global_batch * args.gas,
           "train_micro_batch_size_per_gpu": args.global_batch // world, "gradient_accumulation_steps": args.gas,
           "gradient_clipping": 0.0, "steps_per_print": 10**9,
           "wall_clock_breakdown": False, "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": stage_of(args.system)}}
    client = C.make_adamw(model.parameters())
    if args.system.endswith("-offload"):  # DeepSpeedCPUAdam, built by DeepSpeed from the config's AdamW
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        cfg["optimizer"], client = ADAMW_BLOCK, None
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=client, model_parameters=model.parameters(),
                                             config=cfg, dist_init_required=False)

    counted = {"bytes": 0}

    def step(batches: Batch) -> torch.Tensor:
        before = comm_count.TOTAL["bytes"]
        loss = _engine_step(engine, batches)
        counted["bytes"] += comm_count.TOTAL["bytes"] - before
        return loss

    def state() -> int:
        ts = list(model.parameters()) + [p.grad for p in model.parameters()]
        inner = getattr(opt, "optimizer", opt)
        ts += C.optimizer_state_tensors(inner)
        for name in ("single_partition_of_fp32_groups", "averaged_gradients"):
            v = getattr(opt, name, None)
            if isinstance(v, dict):
                v = [t for lst in v.values() for t in (lst if isinstance(lst, list) else [lst])]
            ts += list(v or [])
        return C.tensor_bytes_dedup(ts)

    def full_params() -> list[torch.Tensor]:  # ZeRO-3 keeps partitions: gather to read them
        params = list(model.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=stage_of(args.system) == 3):
            return [p.detach().clone() for p in params]

    return step, state, full_params, lambda: counted["bytes"]


def _setup_one(system: str, args, world: int):
    args.system = system
    model = C.build_model(args)
    setup = setup_zerorun if system.startswith("zerorun") else (
        setup_deepspeed if system.startswith("ds-") else setup_torch)
    numel = sum(q.numel() for q in model.parameters())  # before setup: stage 3 leaves shards behind
    step, state, full_params, comm_bytes = setup(args, model, world)
    return {"name": system, "step": step, "state": state, "full_params": full_params, "comm_bytes": comm_bytes,
            "numel": numel, "meter": C.Meter(), "warm_bytes": 0}


def _record(sys_: dict, g: torch.Tensor, args, world: int, threads: int, single: bool) -> dict:
    k = args.steps
    slowest = g[:, :k].max(dim=0).values.tolist()[args.warmup:]
    losses = g[:, k:2 * k].mean(dim=0).tolist()
    rec = {"system": sys_["name"], "world": world, "threads": threads, "n_params": sys_["numel"],
           "step_median_s": statistics.median(slowest), "step_min_s": min(slowest),
           "peak_rss_mb": round(float(g[:, 2 * k].max()) / 2**20, 1) if single else None,
           "state_mb_rank0": round(float(g[0, 2 * k + 1]) / 2**20, 1),
           "comm_mb_per_step": round(float(g[0, 2 * k + 2]) / 2**20, 1),
           "final_loss": losses[-1], "param_l2": float(g[0, 2 * k + 3]), "losses": losses,
           "interleaved": not single}
    if torch.cuda.is_available() and single:
        rec["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return rec


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--system", required=True,
                   help="one system, or several comma-separated: then they run interleaved, step by step, "
                        "in this one job (same load for all; peak RSS is not per system then)")
    p.add_argument("--bucket", type=int, default=None,
                   help="zerorun reduce_bucket_size (elements; default: the config default)")
    p.add_argument("--overlap", choices=["true", "false"], default=None,
                   help="zerorun overlap_comm (default: the config default for the stage)")
    p.add_argument("--prefetch", type=int, default=2_200_000,
                   help="zerorun-z3-reshard stage3_prefetch_bucket_size (elements; ~2 units of the default model)")
    args = p.parse_args()
    names = args.system.split(",")
    if any(n.startswith("ds-") for n in names):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = C.setup_threads(args, world)
    systems = [_setup_one(n, args, world) for n in names]
    for s in range(args.steps):
        batches = [C.get_batch(args, s * args.gas + k, rank, world) for k in range(args.gas)]
        rotation = s % len(systems)  # rotate the order so no system always runs first
        for sys_ in systems[rotation:] + systems[:rotation]:
            if s == args.warmup:
                sys_["warm_bytes"] = sys_["comm_bytes"]()
            sys_["meter"].start()
            loss = sys_["step"](batches)
            sys_["meter"].stop(float(loss))
    timed_steps = args.steps - args.warmup
    for sys_ in systems:
        comm_per_step = (sys_["comm_bytes"]() - sys_["warm_bytes"]) / max(1, timed_steps)
        l2 = sum(float(t.detach().double().pow(2).sum()) for t in sys_["full_params"]()) ** 0.5
        m = sys_["meter"]
        local = torch.tensor(m.step_times + m.losses + [C.vm_hwm_bytes(), sys_["state"](), comm_per_step, l2],
                             dtype=torch.float64)
        gathered = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        if rank == 0:
            rec = _record(sys_, torch.stack(gathered), args, world, threads, single=len(systems) == 1)
            print(C.RESULT_PREFIX + json.dumps(rec), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
