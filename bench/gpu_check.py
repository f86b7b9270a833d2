"""The GPU check: the engine on CUDA with NCCL at world size 1, each check plain pass/fail.

    bash scripts/gpu_check.sh                     # one GPU; JSON under bench/results/gpu_check/<UTC time>/
    bash scripts/gpu_check.sh --cpu --out DIR     # dry mode: the same code path on CPU/gloo, tiny sizes

Checks (figures in ``summary.json``, one entry per check with ``passed``):

* ``parity/stage{0..3}-{fp32,bf16}``: the engine against plain PyTorch (fp32 master weights,
  compute in the dtype, AdamW) on the tied-embedding GPT of examples/train_gpt.py, step by
  step. Tolerances as in tests/engine/test_engine_parity.py: fp32 rtol 1e-5; bf16 rtol 2^-8 on
  losses, 2^-7 + 0.1 x lr per step on parameters.
* ``stage3/zero_init``, ``stage3/offload_cpu`` (optimizer and parameters in pinned host
  memory - pinned is checked where CUDA is present), ``stage3/offload_nvme``: the same parity.
* ``checkpoint/stage{2,3}``: train, save, train on; a fresh engine loads and trains the same
  steps: the losses must agree (rtol 1e-6).
* ``memory/stage{0..3}``: a ~100M-parameter GPT (bf16, AdamW): the allocator's peak
  (``torch.cuda.max_memory_allocated`` over the training steps) against the ``zerorun
  estimate`` row of that stage (model states + buffers + activations, no context overhead);
  the ratio must be within 10%. ``setup_peak_allocated`` (initialize's own peak) is reported.
  The dry mode has no allocator: it compares the engine's own ``memory_breakdown()`` with the
  estimate's model states and buffers, and only reports.
  Beside the allocator's peak, ``max_memory_reserved`` (the caching allocator's own peak,
  fragmentation included) is reported. ``memory/stage3-reuse0`` repeats stage 3 with
  ``stage3_max_reuse_distance=0`` (every unit released right after use: the floor).
* every parity check also fails if a parameter is not on the compute device after training.
* ``collectives/world1``: the engine's collectives on the world group, issued at world size 1
  (``Collectives(live_at_one=True)``) so NCCL's kernels really run: values and counts, and the
  device memory outside the allocator (CUDA context + NCCL's buffers) within the estimate's
  fixed overhead (``zerorun estimate``'s 1 GiB).
* ``sanitizer/parity``: the parity checks again in a child under ``TORCH_CUDA_SANITIZER=1``
  (torch's stream sanitizer): no data race between streams may be reported.
* ``syncs/stage{0..3}``: host syncs per optimizer step counted by
  ``torch.cuda.set_sync_debug_mode("warn")``: at most one (the gradient norm).
* ``throughput/stage{0..3}``, ``throughput/stage{2,3}-offload_cpu``: a 1B-class GPT (0.87B parameters,
  bf16, AdamW, 4 x 1024 tokens; the optimizer in pinned host memory for the offload rows):
  step time, tokens/s, model TFLOPs (6 per parameter per token + attention), peak memory.
* ``compile/stage{2,3}``: ``engine.compile()`` (inductor) against eager on the parity GPT: the same
  losses, and the compiled/eager step time (bench/gpu_check_compile.py).

* ``engine/live-stage{0..3}``: the engine with every collective issued at world 1
  (``ZERORUN_CHECK_COLLECTIVES=live``) on the bootstrap's backend and device (NCCL's policy:
  native reduce-scatter, configured buckets), under the stress mode (``torch.cuda._sleep``
  before every collective wait and every queued host<->device copy: the compute stream is
  busy, so anything the host does not wait for is still queued), parity as above.
* ``stage3/nvme-pinned``: stage 3 with parameters and optimizer on NVMe, ``pin_memory``, on the
  ~100M model (units large enough for the copies to overlap), stressed: parity against stage 3
  without offload, and the pinned host bytes torch's caching host allocator keeps after the
  steps within the staging ring + the gradient shards copied down (no masters, no shards).
* ``setup/stage{0..2}``: initialize's own peak (``max_memory_allocated``) within the model in
  bf16 + one fp32 bucket + the masters on the device (none with ``offload_optimizer``, stages
  1-2), or what the stage holds after set-up, whichever is larger.

``--dry-run`` prints every check with its sizes, bounds and time budget, computed from the
models built on the ``meta`` device, and runs nothing.

What one GPU cannot prove: the order of collectives between ranks (NCCL at world size 1 is a
copy, a mismatch cannot hang or mix buckets), the overlap of communication with compute
(a world-1 collective takes no time), cross-rank numerics (reduction order, padding of
shards across ranks), and multi-node launch. Those are held on CPU by the gloo test suite
(parity at worlds 2-4, the deferred-work mode, the shared-memory lane's descriptors).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/gpu_check.py` from anywhere
    sys.path.insert(0, str(ROOT))

import zerorun  # noqa: E402
import zerorun.engine.comm.bootstrap  # noqa: E402
from bench import gpu_check_device as device_checks  # noqa: E402
from bench import gpu_check_plan  # noqa: E402
from bench import gpu_check_stress as stress  # noqa: E402
from bench.gpu_check_compile import check_compile  # noqa: E402
from bench.gpu_check_model import (  # noqa: E402
    CPU_SIZES,
    GPU_SIZES,
    Sizes,
    batch,
    build,
    compare,
    config,
    loss_of,
    make_model,
    params_of,
    placement,
    reference,
    train,
)
from zerorun.engine.metrics import model_state_bytes  # noqa: E402
from zerorun.estimate import (  # noqa: E402
    ActivationPolicy,
    Buckets,
    Dtype,
    EstimateRequest,
    ModelShape,
    Optimizer,
    Placement,
    Training,
    estimate_row,
)

MEMORY_TOLERANCE = 0.10


# ---- the checks -------------------------------------------------------------------------------
def on_device(out: dict[str, Any], engine: Any, device: torch.device) -> dict[str, Any]:
    """Add where the parameters live; a parameter off the compute device fails the check."""
    out["placement"] = placement(engine)
    out["passed"] = out["passed"] and out["placement"]["params"] == [device.type]
    return out


def check_parity(s: Sizes, device: torch.device, stage: int, dtype: str) -> dict[str, Any]:
    engine = build(s.parity, config(s.parity, stage, dtype))
    losses = train(engine, s.parity, 0, s.steps)
    out = compare(dtype, s.steps, losses, params_of(engine), reference(s.parity, dtype, s.steps, device))
    return on_device(out, engine, device)


def _pinned(engine: Any) -> bool:
    """The offloaded fp32 masters and the resting parameter shards are all in pinned memory."""
    held = [m.data for m in engine.parts.masters.masters]
    offload = getattr(engine.parts, "param_offload", None)
    held += [b.local for b in (offload.buckets if offload is not None else []) if b.local is not None]
    held = [t for t in held if t.numel()]
    return bool(held) and all(t.device.type == "cpu" and t.is_pinned() for t in held)


def check_stage3(s: Sizes, device: torch.device, variant: str, swap: Path) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage3_param_persistence_threshold": 0}
    if variant == "offload_cpu":
        zero |= {"offload_optimizer": {"device": "cpu", "pin_memory": True},
                 "offload_param": {"device": "cpu", "pin_memory": True}}
    elif variant == "offload_nvme":
        zero |= {"offload_optimizer": {"device": "nvme", "nvme_path": str(swap), "pin_memory": True},
                 "offload_param": {"device": "nvme", "nvme_path": str(swap), "pin_memory": True}}
    engine = build(s.parity, config(s.parity, 3, "fp32", **zero), zero_init=variant == "zero_init")
    pinned = _pinned(engine) if variant == "offload_cpu" else None
    losses = train(engine, s.parity, 0, s.steps)
    ref = reference(s.parity, "fp32", s.steps, device, host_step=variant.startswith("offload"))
    out = on_device(compare("fp32", s.steps, losses, params_of(engine), ref), engine, device)
    if pinned is not None:
        out["pinned"] = pinned
        out["passed"] = out["passed"] and pinned == (device.type == "cuda")
    return out


def check_checkpoint(s: Sizes, stage: int, root: Path) -> dict[str, Any]:
    g, half = s.parity, max(1, s.steps // 2)
    cfg = config(g, stage, "fp32")
    first = build(g, cfg)
    train(first, g, 0, half)
    first.save_checkpoint(str(root), tag="half")
    straight = train(first, g, half, half)
    second = build(g, cfg)
    second.load_checkpoint(str(root), tag="half")
    resumed = train(second, g, half, half)
    err = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(resumed, straight, strict=True))
    return {"passed": err <= 1e-6, "loss_rel_err": err, "straight": straight, "resumed": resumed}


def check_memory(s: Sizes, device: torch.device, stage: int, **zero: Any) -> dict[str, Any]:
    g, cuda = s.memory, device.type == "cuda"
    gc.collect()  # earlier checks' engines (reference cycles through their hooks) are gone
    if cuda:
        torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    engine = build(g, config(g, stage, "bf16", reduce_bucket_size=50_000_000, **zero))  # a common production size
    psi = engine.num_parameters()
    setup_peak = torch.cuda.max_memory_allocated() - base if cuda else None  # a figure: initialize's own peak
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the peak from here on: model states are already held
    train(engine, g, 0, 3)
    shape = ModelShape(hidden=g.dim, layers=g.layers, heads=g.heads, vocab=g.vocab, seq_len=g.block,
                       micro_batch=g.batch, tied_embeddings=True)
    row = estimate_row(EstimateRequest(Training(psi, 1, Dtype.BF16, Optimizer.ADAMW), gpus_per_node=1,
                                       buckets=Buckets.from_zero_config(engine.config.zero_optimization),
                                       shape=shape, activation_policy=ActivationPolicy(flash_attention=True),
                                       overhead=0), Placement(stage))
    breakdown = engine.memory_breakdown()
    states_and_buffers = row.gpu["params"] + row.gpu["gradients"] + row.gpu["optimizer_states"] \
        + row.gpu["grad_accum"] + row.gpu["buffers"]
    out: dict[str, Any] = {"params": psi, "estimate": row.gpu, "estimate_total": row.total,
                           "engine_breakdown": breakdown,
                           "breakdown_ratio": model_state_bytes(breakdown) / states_and_buffers}
    if cuda:
        peak = torch.cuda.max_memory_allocated() - base
        out |= {"max_memory_allocated": peak, "baseline_allocated": base, "ratio": peak / row.total,
                "max_memory_reserved": torch.cuda.max_memory_reserved(), "setup_peak_allocated": setup_peak}
        out["passed"] = abs(out["ratio"] - 1.0) <= MEMORY_TOLERANCE
    else:
        out["passed"] = out["breakdown_ratio"] > 0  # dry mode: no allocator to compare; figures only
        out["dry"] = True
    return out


def check_live(s: Sizes, device: torch.device, stage: int) -> dict[str, Any]:
    """Parity with every collective issued at world 1, stressed (see bench/gpu_check_stress.py)."""
    with stress.live_collectives(), stress.stressed() as counts:
        engine = build(s.parity, config(s.parity, stage, "fp32"))
        losses = train(engine, s.parity, 0, s.steps)
    out = compare("fp32", s.steps, losses, params_of(engine), reference(s.parity, "fp32", s.steps, device))
    calls = {k: v["calls"] for k, v in engine.comm_stats().items() if v["calls"]}
    out |= {"calls": calls, "native": engine.coll.native_reduce_scatter, "stressed": dict(counts),
            "live": engine.coll.live_at_one}
    cuda = device.type == "cuda"
    out["passed"] = out["passed"] and engine.coll.live_at_one and bool(calls) and (
        not cuda or (out["native"] and counts["waits"] > 0))
    return on_device(out, engine, device)


def check_nvme_pinned(s: Sizes, device: torch.device, swap: Path) -> dict[str, Any]:
    """Stage 3, parameters and optimizer on NVMe with pin_memory, stressed, against stage 3 without offload."""
    g, cuda = s.memory, device.type == "cuda"
    pinned = {"device": "nvme", "nvme_path": str(swap), "pin_memory": True}
    zero = {"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 50_000_000}
    results = {}
    for name, extra in (("plain", {}), ("nvme", {"offload_param": pinned, "offload_optimizer": pinned})):
        gc.collect()
        with stress.stressed() as counts:
            engine = build(g, config(g, 3, "fp32", **zero, **extra))
            results[name] = train(engine, g, 0, s.steps)
        if name == "nvme":
            held, bound = stress.pinned_host_bytes(), stress.nvme_pinned_bound(engine)
            engine.parts.param_offload.close()
        del engine
    err = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(results["nvme"], results["plain"], strict=True))
    out = {"losses": results["nvme"], "plain_losses": results["plain"], "loss_rel_err": err, "stressed": dict(counts),
           "pinned_host_bytes": held, "pinned_bound": bound}
    out["passed"] = err <= 1e-5 and (not cuda or (held is not None and held <= bound))
    return out


def check_setup_peak(s: Sizes, device: torch.device, stage: int) -> dict[str, Any]:
    """initialize's peak on the device against stages 0-2's streamed set-up bound."""
    g, cuda = s.memory, device.type == "cuda"
    zero: dict[str, Any] = {"reduce_bucket_size": 50_000_000}
    if stage > 0:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}  # the masters never touch the device
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    engine = build(g, config(g, stage, "bf16", **zero))
    if not cuda:
        return {"passed": True, "dry": True, **stress.setup_bound(engine, 0)}
    peak, after = torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base
    out = {"setup_peak": peak, **stress.setup_bound(engine, after)}
    out["passed"] = peak <= out["bound"] * 1.02 + (8 << 20)  # allocator rounding, cuBLAS workspace
    return out


def check_setup(device: torch.device, dry: bool) -> dict[str, Any]:
    """The group serves the device the mode asks for: CUDA with NCCL, or the CPU with gloo (dry)."""
    backends = zerorun.engine.comm.bootstrap.group_backends()
    want = ("cpu", "gloo") if dry else ("cuda", "nccl")
    return {"passed": (device.type, backends.get(device.type)) == want, "backends": backends,
            "device": str(device)}


def checks(s: Sizes, device: torch.device, scratch: Path, dry: bool) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    out: list[tuple[str, Callable[[], dict[str, Any]]]] = [("setup", lambda: check_setup(device, dry))]
    for stage in range(4):
        for dtype in ("fp32", "bf16"):
            out.append((f"parity/stage{stage}-{dtype}", lambda st=stage, dt=dtype: check_parity(s, device, st, dt)))
    for variant in ("zero_init", "offload_cpu", "offload_nvme"):
        out.append((f"stage3/{variant}", lambda v=variant: check_stage3(s, device, v, scratch / "swap")))
    for stage in (2, 3):
        out.append((f"checkpoint/stage{stage}", lambda st=stage: check_checkpoint(s, st, scratch / f"ckpt{st}")))
    for stage in range(4):
        out.append((f"memory/stage{stage}", lambda st=stage: check_memory(s, device, st)))
    out.append(("memory/stage3-reuse0", lambda: check_memory(s, device, 3, stage3_max_reuse_distance=0)))
    for stage in range(4):
        out.append((f"engine/live-stage{stage}", lambda st=stage: check_live(s, device, st)))
    out.append(("stage3/nvme-pinned", lambda: check_nvme_pinned(s, device, scratch / "swap-pinned")))
    for stage in range(3):
        out.append((f"setup/stage{stage}", lambda st=stage: check_setup_peak(s, device, st)))
    out.append(("collectives/world1", lambda: device_checks.check_collectives(device)))
    out.append(("sanitizer/parity", lambda: device_checks.check_sanitizer(dry, scratch)))
    for stage in range(4):
        out.append((f"syncs/stage{stage}", lambda st=stage: check_syncs(s, st)))
    for stage in range(4):
        out.append((f"throughput/stage{stage}", lambda st=stage: check_throughput(s, st)))
    for stage in (2, 3):  # the host step (fused AdamW on the host's cores) is the step's speed here
        out.append((f"throughput/stage{stage}-offload_cpu", lambda st=stage: check_throughput(s, st, offload=True)))
    for stage in (2, 3):  # bench/gpu_check_compile.py
        out.append((f"compile/stage{stage}", lambda st=stage: check_compile(s, st, dry)))
    return out


def check_syncs(s: Sizes, stage: int) -> dict[str, Any]:
    g = s.parity
    engine = build(g, config(g, stage, "bf16"))
    return device_checks.count_syncs(engine, s.steps, lambda i, d: batch(g, i, d), loss_of)


def check_throughput(s: Sizes, stage: int, offload: bool = False) -> dict[str, Any]:
    g = s.throughput
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    zero: dict[str, Any] = {"offload_optimizer": {"device": "cpu", "pin_memory": True}} if offload else {}
    engine = build(g, config(g, stage, "bf16", reduce_bucket_size=500_000_000, **zero))  # DeepSpeed's default
    psi = engine.num_parameters()
    flops = device_checks.model_flops_per_token(psi, g.layers, g.dim, g.block)
    out = device_checks.measure_throughput(engine, s.steps, g.batch * g.block, flops,
                                           lambda i, d: batch(g, i, d), loss_of)
    del engine
    return {"params": psi, "tokens_per_step": g.batch * g.block, **out}


def run(cpu: bool, out_dir: Path, only: str | None = None) -> dict[str, Any]:
    if not cpu and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device\nhint: run on a GPU machine, or pass --cpu for the dry mode")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):  # world size 1, whatever the shell says
        os.environ.pop(key, None)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity means fp32 matmuls
    torch.backends.cudnn.allow_tf32 = False
    ctx = zerorun.init_distributed(dist_backend="gloo" if cpu else "nccl")
    sizes = CPU_SIZES if cpu else GPU_SIZES
    summary: dict[str, Any] = {"mode": "cpu" if cpu else "cuda", "backend": ctx.backend, "device": str(ctx.device),
                               "torch": torch.__version__, "sizes": asdict(sizes), "checks": {}}
    if ctx.device.type == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(ctx.device)
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(complete: bool) -> None:  # after every check: a run stopped by the time limit still tells
        summary["seconds"] = round(time.monotonic() - started, 1)
        summary["complete"] = complete
        summary["passed"] = complete and all(c["passed"] for c in summary["checks"].values())
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))

    with tempfile.TemporaryDirectory(prefix="zerorun-gpu-check-") as tmp:
        for name, fn in checks(sizes, ctx.device, Path(tmp), cpu):
            if only and only not in name:
                continue
            t0 = time.monotonic()
            try:
                result = fn()
            except Exception as e:  # a failing check is a figure too; the others still run
                result = {"passed": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            result["seconds"] = round(time.monotonic() - t0, 2)
            summary["checks"][name] = result
            write(complete=False)
            print(f"{'PASS' if result['passed'] else 'FAIL'}  {name}  ({result['seconds']} s)", flush=True)
    write(complete=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="dry mode: CPU and gloo, tiny sizes")
    parser.add_argument("--out", type=Path, default=None, help="folder for summary.json "
                        "(default: bench/results/gpu_check/<UTC time>)")
    parser.add_argument("--only", default=None, help="run the checks whose name contains this")
    parser.add_argument("--dry-run", action="store_true", help="print every check's sizes, bounds and time "
                        "budget (models on the meta device) and run nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        print(gpu_check_plan.render(gpu_check_plan.plan(GPU_SIZES, make_model, config, [n for n, _ in
                                                       checks(GPU_SIZES, torch.device("meta"), Path("."), False)])))
        return 0
    out = args.out or ROOT / "bench" / "results" / "gpu_check" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    summary = run(args.cpu, out, args.only)
    failed = [n for n, c in summary["checks"].items() if not c["passed"]]
    print(f"{'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)}; "
          f"summary: {out / 'summary.json'} ({summary['seconds']} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
