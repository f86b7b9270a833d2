"""``scripts/gpu_check.sh --dry-run``: every check of the GPU check, its sizes, bounds and time budget.

Nothing runs: the models are built on the ``meta`` device (no storage), the buckets and units
are laid out with the engine's own planner, and the bounds are the ones the checks enforce on
a GPU (bench/gpu_check.py, bench/gpu_check_stress.py). The time budgets are estimates for an
H100-class GPU (no GPU has run the check yet); the script's limit leaves room for a rerun.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.gpu_check_device import model_flops_per_token
from bench.gpu_check_stress import SLEEP_CYCLES, pow2
from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS, plan_buckets, round_up

LIMIT_S = 480  # scripts/gpu_check.sh stops the run here
# seconds per check, by name prefix (estimates; the first GPU run replaces them with figures)
BUDGET_S = {"setup": 2, "parity/": 3, "stage3/zero_init": 3, "stage3/offload_cpu": 4, "stage3/offload_nvme": 5,
            "checkpoint/": 4, "memory/": 8, "engine/live": 4, "stage3/nvme-pinned": 15, "setup/": 6,
            "collectives/": 1, "sanitizer/": 60, "syncs/": 3, "throughput/": 20,
            "compile/": 40}
GiB = 2**30


def _meta_model(make_model: Callable[[Any], torch.nn.Module], g: Any) -> torch.nn.Module:
    with torch.device("meta"):
        return make_model(g)


def _largest_bucket(model: torch.nn.Module, bucket_numel: int) -> int:
    plans = plan_buckets([p.shape for p in model.parameters()], bucket_numel, 1, align=ALIGN_ELEMENTS)
    return max(p.padded_numel for p in plans)


def _unit_numels(model: torch.nn.Module) -> list[int]:
    """Elements of each stage-3 unit (a module's own parameters, a tied one counted where first met), aligned."""
    seen: set[int] = set()
    out = []
    for m in model.modules():
        own = [p for p in m.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if own:
            out.append(sum(round_up(p.numel(), ALIGN_ELEMENTS) for p in own))
    return out


def _budget(name: str) -> int:
    if name in BUDGET_S:
        return BUDGET_S[name]
    return next((v for k, v in BUDGET_S.items() if k.endswith("/") and name.startswith(k)), 5)


def plan(sizes: Any, make_model: Callable[[Any], torch.nn.Module], config: Callable[..., dict[str, Any]],
         names: list[str]) -> list[tuple[str, str, int]]:
    """``(check, arithmetic, budget seconds)`` for every check, in run order."""
    mem = _meta_model(make_model, sizes.memory)
    psi = sum(p.numel() for p in mem.parameters())
    par_psi = sum(p.numel() for p in _meta_model(make_model, sizes.parity).parameters())
    big = sizes.throughput
    big_psi = sum(p.numel() for p in _meta_model(make_model, big).parameters())
    largest = _largest_bucket(mem, 50_000_000)
    units = _unit_numels(mem)
    ring, grads = 2 * pow2(4 * max(units)), sum(pow2(4 * u) for u in units)
    rows = []
    for name in names:
        if name.startswith(("parity/", "checkpoint/", "stage3/zero", "stage3/offload")):
            what = f"{par_psi:,} parameters, {sizes.steps} steps against plain PyTorch (fp32 rtol 1e-5)"
        elif name.startswith("engine/live"):
            what = (f"{par_psi:,} parameters, every collective issued at world 1 on NCCL (native reduce-scatter, "
                    f"configured buckets); torch.cuda._sleep({SLEEP_CYCLES:,}) before each wait and queued copy")
        elif name == "stage3/nvme-pinned":
            what = (f"{psi:,} parameters in {len(units)} units, fp32; pinned kept <= ring 2 x pow2(4 x "
                    f"{max(units):,}) = {ring / 2**20:.0f} MiB + gradients sum pow2(4 x unit) = "
                    f"{grads / 2**20:.0f} MiB = {(ring + grads) / 2**20:.0f} MiB (cpu offload would pin "
                    f"masters + gradients + shards: {(4 + 4 + 4) * psi / 2**20:.0f} MiB)")
        elif name.startswith("setup/"):
            stage = int(name[-1])
            masters = 4 * psi if stage == 0 else 0
            bound = 2 * psi + 4 * largest + masters
            what = (f"initialize's peak <= bf16 model {2 * psi / GiB:.3f} GiB + fp32 bucket {4 * largest / GiB:.3f} "
                    f"GiB + device masters {masters / GiB:.3f} GiB = {bound / GiB:.3f} GiB (x1.02 + 8 MiB), or "
                    f"what stage {stage} holds after set-up" + (" (offload_optimizer cpu)" if stage else ""))
        elif name.startswith("memory/"):
            what = f"{psi:,} parameters, bf16, allocator peak within 10% of `zerorun estimate`"
        elif name.startswith("syncs/"):
            what = f"host syncs over {sizes.steps} steps <= {sizes.steps} (1 per step: the norm), batches prebuilt"
        elif name.startswith("throughput/"):
            flops = model_flops_per_token(big_psi, big.layers, big.dim, big.block)
            what = f"{big_psi:,} parameters, {big.batch} x {big.block} tokens, {flops / 1e9:.1f} GFLOP per token"
        elif name == "setup":
            what = "the world group serves cuda with nccl (the bootstrap's device and backend)"
        elif name.startswith("collectives/"):
            what = "all_reduce x2, reduce_scatter, all_gather, broadcast at world 1: identity; outside-allocator <= 1 GiB"
        elif name.startswith("compile/"):
            what = (f"{par_psi:,} parameters, fp32, {sizes.steps} steps + 2 eager, then compiled (inductor): losses "
                    "rtol 1e-4, compiled/eager step time reported")
        elif name.startswith("sanitizer/"):
            what = "the parity checks again under TORCH_CUDA_SANITIZER=1: 0 races"
        else:
            what = ""
        rows.append((name, what, _budget(name)))
    return rows


def render(rows: list[tuple[str, str, int]]) -> str:
    total = sum(b for _, _, b in rows)
    lines = [f"{'check':<30} {'budget':>7}  arithmetic"]
    lines += [f"{name:<30} {budget:>6}s  {what}" for name, what, budget in rows]
    lines.append(f"total {total} s of the {LIMIT_S} s limit ({LIMIT_S - total} s to spare); twice the total is "
                 f"{2 * total} s: {'a whole rerun fits' if 2 * total <= 600 else 'no room for a whole rerun'} "
                 "in 10 minutes")
    return "\n".join(lines)
