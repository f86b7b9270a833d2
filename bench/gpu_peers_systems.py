"""One child of ``scripts/gpu_check.sh --peers``: some systems of one family, each trained in turn.

    python bench/gpu_peers_systems.py --systems zerorun-z0,zerorun-z3,fsdp2 --shape throughput --out F.jsonl
    DS_ACCELERATOR=cpu python bench/gpu_peers_systems.py --systems ds-z2 --cpu --out F.jsonl
    python bench/gpu_peers_systems.py --systems zerorun-z3 --shape offload --layers 40 --offload cpu --mem-gib 24 ...

Systems (a suffix ``@cpu``/``@nvme`` sets ``--offload`` for that system alone): ``zerorun-z<stage>`` (zerorun.initialize), ``ds-z<stage>`` (deepspeed.initialize, the same
config dict), ``fsdp2`` (``fully_shard`` per block and the root, ``MixedPrecisionPolicy(bf16, fp32
reduce)``, torch's AdamW with its default kernel, as zerorun's config AdamW and DeepSpeed's
``torch_adam`` get). World size 1, bf16, the model and batches of bench/gpu_peers_model.py.

One JSON line per system is appended to ``--out`` as soon as that system is done (a child stopped
by its time limit still leaves the systems it finished). A system that raises (a CUDA
out-of-memory included) is a line with ``error``; the next system still runs.

``--offload cpu|nvme`` (part 2): stage 2 offloads the optimizer, stage 3 the optimizer and the
parameters; ``--mem-gib`` caps the caching allocator with ``set_per_process_memory_fraction`` so
that it and what lives outside it (CUDA context, cuBLAS, NCCL; measured here) make that many GiB.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpu_peers_model as M  # noqa: E402

GiB = 2**30
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def ds_config(s: M.Shape, stage: int, offload: str, nvme: str, torch_adam: bool) -> dict[str, Any]:
    """The one config both engines read (DeepSpeed's keys; every other knob at its default)."""
    zero: dict[str, Any] = {"stage": stage}
    if offload != "none":
        where = {"device": offload, **({"nvme_path": nvme} if offload == "nvme" else {})}
        zero["offload_optimizer"] = dict(where)
        if stage == 3:
            zero["offload_param"] = dict(where)
    return {"train_micro_batch_size_per_gpu": s.batch, "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0, "steps_per_print": 10**9, "bf16": {"enabled": True},
            "optimizer": M.adamw_block(torch_adam), "zero_optimization": zero}


def _engine_step(engine: Any) -> Step:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = M.loss_of(engine(x), y)
        engine.backward(loss)
        engine.step()
        return loss.detach()
    return step


def setup(system: str, model: torch.nn.Module, cfg: dict[str, Any], device: torch.device) -> tuple[Step, Any]:
    if system.startswith("zerorun-"):
        import zerorun

        engine, _, _, _ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        return _engine_step(engine), engine
    if system.startswith("ds-"):
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        return _engine_step(engine), engine
    if system == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (1,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        p = M.adamw_block()["params"]
        opt = torch.optim.AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                                weight_decay=p["weight_decay"])

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = M.loss_of(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step, opt
    raise SystemExit(f"error: unknown system {system!r}\nhint: zerorun-z0..3, ds-z0..3 or fsdp2")


def cap_memory(gib: float, device: torch.device) -> dict[str, Any]:
    """The allocator's limit so that it plus what lives outside it is ``gib`` GiB (a card of that size)."""
    torch.ones(1, device=device) @ torch.ones(1, 1, device=device)  # cuBLAS's workspace, as training makes it
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info(device)
    outside = (total - free) - torch.cuda.memory_reserved(device)
    fraction = max(0.01, (gib * GiB - outside) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return {"card_gib": gib, "outside_allocator": outside, "fraction": fraction, "allocator_limit": fraction * total}


def run_one(spec: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """``spec``: a system, optionally ``@cpu``/``@nvme`` (that offload for it alone, overriding ``--offload``)."""
    system, _, offload = spec.partition("@")
    offload = offload or args.offload
    s = (M.OFFLOAD_CPU if args.cpu else M.OFFLOAD_GPU) if args.shape == "offload" else \
        (M.THROUGHPUT_CPU if args.cpu else M.THROUGHPUT_GPU)
    if args.layers:
        s = s.with_layers(args.layers)
    cuda = device.type == "cuda"
    stage = int(system.rsplit("z", 1)[1]) if "-z" in system else 3
    cfg = ds_config(s, stage, offload, args.nvme, args.torch_adam and system.startswith("ds-"))
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated(device) if cuda else 0  # what an earlier system left behind, if anything
    t0 = time.perf_counter()
    # part 2 builds in bf16: the fp32 model of a large depth would not fit the capped card at all
    model = M.make_model(s, device, torch.bfloat16 if args.shape == "offload" else torch.float32)
    params = sum(p.numel() for p in model.parameters())
    step, keep = setup(system, model, cfg, device)
    setup_s = time.perf_counter() - t0
    data = M.batches(s, device)
    losses, times = [], []
    for i in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        losses.append(step(*data[i % len(data)]))
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    measured = times[args.warmup:] or times
    step_s = sorted(measured)[len(measured) // 2]
    out = {"system": spec, "stage": stage, "offload": offload, "layers": s.layers, "params": params,
           "tokens_per_step": s.tokens, "setup_s": setup_s, "step_s": step_s, "step_times": times,
           "tokens_per_s": s.tokens / step_s, "losses": [float(v) for v in losses],
           "optimizer": type(getattr(keep, "optimizer", keep)).__name__ + _inner_optimizer(keep),
           "baseline_allocated": base if cuda else None,
           "peak_over_baseline": torch.cuda.max_memory_allocated(device) - base if cuda else None,
           "max_memory_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
           "max_memory_reserved": torch.cuda.max_memory_reserved(device) if cuda else None}
    out["fits"] = all(v == v and abs(v) != float("inf") for v in out["losses"])  # finite: it trained
    if args.profile:
        out["profile"] = profile_step(functools.partial(step, *data[0]), cuda)
    close = getattr(getattr(getattr(keep, "parts", None), "param_offload", None), "close", None)
    if close is not None:
        close()
    del step, keep, model
    return out


def profile_step(fn: Callable[[], Any], cuda: bool, top: int = 12) -> dict[str, Any]:
    """One step under torch.profiler: the top kernels by self device time, and the host gaps (the step's
    wall time less the time the device was busy: where the GPU waited for the host)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()

    def device_us(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)

    ranked = sorted(events, key=device_us if cuda else (lambda e: e.self_cpu_time_total), reverse=True)[:top]
    busy = sum(device_us(e) for e in events) / 1e6 if cuda else None
    return {"wall_s": wall, "device_busy_s": busy, "host_gap_s": wall - busy if busy is not None else None,
            "top": [{"name": e.key[:80], "calls": e.count, "self_device_ms": device_us(e) / 1e3,
                     "self_cpu_ms": e.self_cpu_time_total / 1e3} for e in ranked]}


def _inner_optimizer(keep: Any) -> str:
    """DeepSpeed wraps its optimizer: the class that steps (DeepSpeedCPUAdam, FusedAdam, AdamW)."""
    opt = getattr(keep, "optimizer", None)
    inner = getattr(opt, "optimizer", None)
    return f"({type(inner).__name__})" if inner is not None else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", required=True, help="comma-separated: zerorun-z0..3, ds-z0..3, fsdp2; "
                   "a suffix @cpu or @nvme offloads that one")
    p.add_argument("--shape", choices=("throughput", "offload"), default="throughput")
    p.add_argument("--layers", type=int, default=0, help="override the shape's depth (part 2's search)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--offload", choices=("none", "cpu", "nvme"), default="none")
    p.add_argument("--nvme", default="/tmp", help="nvme_path for --offload nvme")
    p.add_argument("--mem-gib", type=float, default=0.0, help="cap the card to this many GiB (CUDA only)")
    p.add_argument("--torch-adam", action="store_true", help="DeepSpeed: torch's AdamW (no compiled op)")
    p.add_argument("--cpu", action="store_true", help="dry mode: CPU and gloo, tiny shapes")
    p.add_argument("--profile", action="store_true", help="one more step under torch.profiler: top kernels, host gaps")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        os.environ.pop(key, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
                      WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
    device = torch.device("cpu" if args.cpu else "cuda", 0 if not args.cpu else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # gloo beside NCCL on a GPU: any collective a system issues on a host tensor (offload) has a backend
    dist.init_process_group("gloo" if args.cpu else "cpu:gloo,cuda:nccl", rank=0, world_size=1)
    header: dict[str, Any] = {"header": True, "torch": torch.__version__, "python": sys.version.split()[0]}
    if args.mem_gib and device.type == "cuda":
        header["cap"] = cap_memory(args.mem_gib, device)
    if any(s.startswith("ds-") for s in args.systems.split(",")):
        import deepspeed

        header["deepspeed"] = deepspeed.__version__
    with args.out.open("a") as f:
        f.write(json.dumps(header) + "\n")
    for system in args.systems.split(","):
        try:
            result = run_one(system, args, device)
        except Exception as e:  # an out-of-memory is a result of part 2, not a crash of the child
            oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
            result = {"system": system, "layers": args.layers, "fits": False, "oom": oom,
                      "error": f"{type(e).__name__}: {str(e)[:600]}", "traceback": traceback.format_exc()[-3000:]}
            if device.type == "cuda":
                result["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
        with args.out.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"{system}: {'error ' + result['error'][:200] if 'error' in result else 'ok'}", flush=True)
        gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
