"""One short training job that ends the way a user's script does: it returns from ``main()`` and exits.

    torchrun --standalone --nproc_per_node 2 bench/exit_job.py --system z2 --steps 10
    zerorun --num_gpus 2 bench/exit_job.py --system z2 --steps 10

``--system ddp`` is plain torch DDP (the benchmark's reference run), ``z0``..``z3`` zerorun at that
ZeRO stage with every other knob at its default. The job is the benchmark's (bench/common.py: a
residual MLP, hidden 512 and 12 layers = 25.5M parameters by default; ``--hidden 16 --layers 2`` for
a tiny one). zerorun prints its own progress line every ``--steps`` steps, as a default config does.
``--end``: what the script does after its last step: ``nothing`` (exit, leaving the teardown to
the engine and the interpreter), ``destroy`` (``engine.destroy()``), ``group``
(``dist.destroy_process_group()``, as many scripts do). :mod:`bench.exit_rounds` runs it round after
round and counts the exit codes.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def _zerorun(model: torch.nn.Module, stage: int, world: int, args) -> tuple[object, object]:
    import zerorun

    cfg = {"train_micro_batch_size_per_gpu": args.global_batch // world, "gradient_clipping": 0.0,
           "steps_per_print": args.steps, "zero_optimization": {"stage": stage}}
    engine, _, _, _ = zerorun.initialize(model=model, optimizer=C.make_adamw(model.parameters()), config=cfg)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        engine.backward(C.loss_fn(engine(x), y))
        engine.step()

    return engine, step


def _ddp(model: torch.nn.Module) -> tuple[object, object]:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = C.make_adamw(ddp.parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        C.loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return ddp, step


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--system", choices=["ddp", "z0", "z1", "z2", "z3"], required=True)
    p.add_argument("--end", choices=["nothing", "destroy", "group"], default="nothing")
    p.add_argument("--local_rank", "--local-rank", type=int, default=0, help="passed by the launcher")
    p.add_argument("--user-group", action="store_true", help="the script creates the process group itself")
    p.add_argument("--gather", action="store_true",
                   help="end as the peer benchmark does: all_gather every rank's figures, then a barrier")
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    C.setup_threads(args, world)
    if args.user_group:
        dist.init_process_group("gloo")
    model = C.build_model(args)
    engine, step = _ddp(model) if args.system == "ddp" else _zerorun(model, int(args.system[1]), world, args)
    for s in range(args.steps):
        step(*C.get_batch(args, s, rank, world))
    if args.system == "ddp" and rank == 0:
        print(f"[ddp] step {args.steps} done", flush=True)
    if args.gather:
        local = torch.tensor([float(rank), float(args.steps)], dtype=torch.float64)
        gathered = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        dist.barrier()
    if args.end == "destroy" and hasattr(engine, "destroy"):
        engine.destroy()
    elif args.end == "group" and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
