"""Part 3 of ``scripts/gpu_check.sh --peers``: kernels that had never run on a GPU, one JSON object.

    python bench/gpu_peers_kernels.py --out K.json [--cpu] [--swap DIR]
    python bench/gpu_peers_kernels.py --ds-adam --numel N --out D.json     # DeepSpeedCPUAdam alone (its Python)

* ``quant``: qwZ's and qgZ's blockwise int8 (zerorun.engine.comm.quantize) on the device: the
  int8 values and scales against the CPU reference (values may differ by one where ``x / s`` lands
  on a rounding tie in another order of operations), the dequantized error against the written
  bound ``max|block| / 254``, and GB/s of the input read (quantize) and of the output written
  (dequantize; qgZ: dequantize-and-add into an fp32 gradient, what the receiver does).
* ``host_step``: one AdamW step over ``numel`` fp32 host elements on all the machine's cores:
  zerorun's host step (torch's fused CPU kernel on masters in 2 MiB pages), torch's foreach,
  and DeepSpeedCPUAdam (``--ds-adam``, in DeepSpeed's Python; JIT-built, skipped where it cannot build).
* ``compensated``: bf16 masters stepped with AdamW at an update below half a bf16 ulp, each mode of
  zerorun.engine.numerics.compensated against the fp32 trajectory, on the device.
* ``nvme``: the swapper's write and read GB/s (its thread pool, the configured ``buffer_count``)
  against ``dd`` on the same folder (``oflag=direct``/``iflag=direct``: the disk itself, not the page
  cache; the swapper's read of files just written may come from the page cache: said beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GB = 1e9


def _timed(fn: Callable[[], Any], device: torch.device, repeat: int) -> float:
    """Median seconds of ``fn`` over ``repeat`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _quant_row(name: str, host: torch.Tensor, device: torch.device, repeat: int) -> dict[str, Any]:
    from zerorun.engine.comm import quantize as Q

    x = host.to(device)
    q, s = Q.quantize(x)
    q_ref, s_ref = Q.quantize(host)
    err = (Q.dequantize(q, s).cpu() - host.float()).abs()
    allowed = Q.error_bound(host) * (1 + 254 * 2**-20) + 1e-30  # max|block| * (1/254 + 2^-20), as the unit tests
    row: dict[str, Any] = {
        "values_differing": int((q.cpu() != q_ref).sum()), "max_value_diff": int((q.cpu().int() - q_ref.int()).abs().max()),
        "scale_max_rel_diff": float(((s.cpu() - s_ref).abs() / s_ref.clamp_min(1e-30)).max()),
        "max_err_over_bound": float((err / allowed).max()), "bound_ok": bool((err <= allowed).all())}
    t_q = _timed(lambda: Q.quantize(x), device, repeat)
    if name == "qwZ":  # the receiver dequantizes into the compute dtype
        into = torch.empty_like(x)
        t_d = _timed(lambda: Q.dequantize(q, s, out=into), device, repeat)
        written = into.numel() * into.element_size()
    else:  # qgZ's receiver adds the dequantized chunk into its fp32 gradient
        grad = torch.zeros(x.numel(), device=device)
        t_d = _timed(lambda: grad.add_(Q.dequantize(q, s)), device, repeat)
        written = 4 * x.numel()
    row |= {"quantize_s": t_q, "quantize_GBps": x.numel() * x.element_size() / t_q / GB,
            "dequantize_s": t_d, "dequantize_GBps": written / t_d / GB}
    row["passed"] = row["bound_ok"] and row["max_value_diff"] <= 1 and row["scale_max_rel_diff"] <= 1e-6
    return row


def quant(device: torch.device, numel: int, repeat: int) -> dict[str, Any]:
    from zerorun.engine.comm.quantize import BLOCK

    gen = torch.Generator().manual_seed(7)
    out: dict[str, Any] = {"numel": numel, "block": BLOCK}
    for name, dtype in (("qwZ", torch.bfloat16), ("qgZ", torch.float32)):
        host = (torch.randn(numel, generator=gen) * torch.rand(numel, generator=gen).pow(4)).to(dtype)
        out[name] = _quant_row(name, host, device, repeat)
    out["passed"] = out["qwZ"]["passed"] and out["qgZ"]["passed"]
    return out


def _adam_step_seconds(make: Callable[[torch.nn.Parameter], torch.optim.Optimizer], numel: int, repeat: int,
                       huge: bool = False) -> float:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(numel))
    if huge:
        from zerorun.engine.offload import hugepages

        p.data = hugepages.huge_copy(p.data)
    p.grad = torch.randn(numel)
    opt = make(p)
    opt.step()
    if huge:
        hugepages.settle_state(opt, [p])  # HostMasters.step does this after the step that made the state
    return _timed(opt.step, torch.device("cpu"), repeat)


ADAM = {"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}


def host_step(numel: int, repeat: int) -> dict[str, Any]:
    from zerorun.engine.offload import hugepages
    from zerorun.engine.training.optim_factory import build_optimizer

    def zerorun_host(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return build_optimizer("AdamW", dict(ADAM), [p], host_step=True)

    rows = {"zerorun host step": _adam_step_seconds(zerorun_host, numel, repeat, huge=True),
            "torch foreach": _adam_step_seconds(lambda p: torch.optim.AdamW([p], foreach=True, **ADAM), numel, repeat)}
    return {"numel": numel, "threads": torch.get_num_threads(), "huge_pages_wanted": hugepages.wanted(),
            "seconds": rows, "ns_per_param": {k: 1e9 * v / numel for k, v in rows.items()}, "passed": True}


def ds_adam(numel: int, repeat: int) -> dict[str, Any]:
    """DeepSpeedCPUAdam's step (run in DeepSpeed's Python); its op JIT-builds on first use."""
    t0 = time.perf_counter()
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    def make(p: torch.nn.Parameter) -> torch.optim.Optimizer:
        return DeepSpeedCPUAdam([p], adamw_mode=True, **ADAM)

    seconds = _adam_step_seconds(make, numel, repeat)
    return {"numel": numel, "threads": torch.get_num_threads(), "seconds": seconds, "ns_per_param": 1e9 * seconds / numel,
            "with_build_s": time.perf_counter() - t0}


def compensated(device: torch.device, numel: int, steps: int) -> dict[str, Any]:
    """SGD steps of ~2^-12 relative on bf16 masters (below half a bf16 ulp, 2^-9), the same gradient every
    step: the fraction of the fp32 trajectory's move each mode keeps (nearest ~0, Kahan and stochastic
    rounding ~1; Kahan's stored value plus its compensation buffer, as its next step sees it)."""
    from zerorun.engine.numerics.compensated import KAHAN_KEY, MODES, Compensation

    gen = torch.Generator().manual_seed(3)
    start = (1.0 + 0.5 * torch.rand(numel, generator=gen)).to(torch.bfloat16).to(device)
    grad = torch.randn(numel, generator=gen).to(device)
    lr = 2**-12

    def run(mode: str | None) -> tuple[torch.Tensor, float]:
        m = torch.nn.Parameter(start.float() if mode is None else start.clone())
        opt = torch.optim.SGD([m], lr=lr)
        comp = Compensation(mode or "nearest", 0, device)
        t0 = time.perf_counter()
        for _ in range(steps):
            m.grad = grad.clone() if mode is None else grad.to(torch.bfloat16)
            if mode is None:
                opt.step()
            else:
                with comp.widened(opt, [m]):
                    opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        got = m.detach().float()
        if mode == "kahan":
            got = got + opt.state[m][KAHAN_KEY].float()
        return got, (time.perf_counter() - t0) / steps

    ref, _ = run(None)
    move = ref - start.float()
    out: dict[str, Any] = {"numel": numel, "steps": steps, "lr": lr, "fp32_mean_move": move.abs().mean().item()}
    for mode in MODES:
        got, per_step = run(mode)
        kept = ((got - start.float()) * move.sign()).mean().item() / move.abs().mean().item()
        out[mode] = {"kept_of_fp32_move": kept, "step_s": per_step,
                     "GBps": numel * (2 + 2 + 2) / per_step / GB}  # bf16 master read + written, bf16 grad read
    out["passed"] = out["nearest"]["kept_of_fp32_move"] < 0.5 and abs(out["kahan"]["kept_of_fp32_move"] - 1) < 0.1 \
        and abs(out["stochastic_rounding"]["kept_of_fp32_move"] - 1) < 0.2
    return out


def _dd(args: list[str]) -> float:
    """dd's own rate in GB/s (its last line: '..., 1.2 GB/s'), else from the wall time."""
    t0 = time.perf_counter()
    done = subprocess.run(["dd", *args], capture_output=True, text=True, timeout=120, check=True)
    took = time.perf_counter() - t0
    m = re.search(r"copied, ([\d.]+) s", done.stderr)
    seconds = float(m.group(1)) if m else took
    size = re.search(r"^(\d+) bytes", done.stderr, re.M)
    return int(size.group(1)) / max(seconds, 1e-9) / GB if size else float("nan")


def nvme(root: Path, chunk_bytes: int, chunks: int, workers: int) -> dict[str, Any]:
    from zerorun.engine.offload.swapper import Swapper

    root.mkdir(parents=True, exist_ok=True)
    total = chunk_bytes * chunks
    tensors = [torch.full((chunk_bytes // 4,), float(i)) for i in range(chunks)]
    sw = Swapper(root, workers, 2 * total)
    try:
        t0 = time.perf_counter()
        for f in [sw.write(f"t{i}", t) for i, t in enumerate(tensors)]:
            f.result()
        for f in sw.dir.iterdir():  # the bytes on the disk, as dd's conv=fsync has them
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = [f.result() for f in [sw.read(f"t{i}", chunk_bytes // 4, torch.float32) for i in range(chunks)]]
        read_s = time.perf_counter() - t0
        same = all(torch.equal(a, b) for a, b in zip(back, tensors, strict=True))
    finally:
        sw.close()
    out: dict[str, Any] = {"path": str(root), "bytes": total, "workers": workers, "same_bytes": same,
                           "swapper_write_GBps": total / write_s / GB, "swapper_read_GBps": total / read_s / GB,
                           "read_note": "files just written: the read may come from the page cache"}
    probe = root / "dd-probe"
    bs, count = f"{max(1, chunk_bytes >> 20)}M", str(chunks)
    try:
        out["dd_write_GBps"] = _dd(["if=/dev/zero", f"of={probe}", f"bs={bs}", f"count={count}", "oflag=direct",
                                    "conv=fsync"])
        out["dd_read_GBps"] = _dd([f"if={probe}", "of=/dev/null", f"bs={bs}", "iflag=direct"])
    except (subprocess.SubprocessError, OSError) as e:  # tmpfs and some filesystems refuse O_DIRECT
        out["dd_error"] = f"{type(e).__name__}: {e}"
        out["dd_write_GBps"] = _dd(["if=/dev/zero", f"of={probe}", f"bs={bs}", f"count={count}", "conv=fsync"])
        out["dd_read_GBps"] = _dd([f"if={probe}", "of=/dev/null", f"bs={bs}"])
    finally:
        probe.unlink(missing_ok=True)
    out["passed"] = same
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="dry mode: tiny sizes on the CPU")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--swap", type=Path, default=None, help="folder for the NVMe figures (default: a temp folder)")
    p.add_argument("--ds-adam", action="store_true", help="only DeepSpeedCPUAdam's step (DeepSpeed's Python)")
    p.add_argument("--numel", type=int, default=0, help="host step elements (default: 100M, CPU 1M)")
    args = p.parse_args(argv)
    cuda = not args.cpu and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    numel = args.numel or (1 << 18 if args.cpu else 100_000_000)
    repeat = 2 if args.cpu else 5
    if args.ds_adam:
        try:
            result: dict[str, Any] = ds_adam(numel, repeat)
        except Exception as e:  # no compiler, no headers: said, not hidden
            result = {"error": f"{type(e).__name__}: {str(e)[:800]}"}
        args.out.write_text(json.dumps(result, indent=2))
        return 0
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "quant": lambda: quant(device, 1 << 14 if args.cpu else 1 << 27, repeat),
        "host_step": lambda: host_step(numel, repeat),
        "compensated": lambda: compensated(device, 1 << 12 if args.cpu else 1 << 26, 8 if args.cpu else 32),
    }
    results: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="zerorun-peers-swap-", dir=args.swap) as tmp:
        parts["nvme"] = lambda: nvme(Path(tmp), (1 << 20) if args.cpu else (64 << 20), 4 if args.cpu else 32, 4)
        for name, fn in parts.items():
            t0 = time.perf_counter()
            try:
                results[name] = fn()
            except Exception as e:  # one kernel failing leaves the others' figures
                results[name] = {"passed": False, "error": f"{type(e).__name__}: {str(e)[:800]}",
                                 "traceback": traceback.format_exc()[-2000:]}
            results[name]["seconds"] = round(time.perf_counter() - t0, 2)
            args.out.write_text(json.dumps(results, indent=2))
            print(f"{name}: {'ok' if results[name].get('passed') else 'FAILED'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
