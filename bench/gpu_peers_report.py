"""The Markdown tables and the issue's targets of ``scripts/gpu_check.sh --peers`` (from summary.json alone)."""

from __future__ import annotations

from typing import Any

GB = 1e9


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def _target(what: str, measured: float | None, bound: float, below: bool = True) -> dict[str, Any]:
    met = None if measured is None else (measured <= bound if below else measured >= bound)
    return {"target": what, "measured": measured, "bound": bound, "met": met}


def throughput_targets(systems: dict[str, dict[str, Any]], cpu: bool) -> list[dict[str, Any]]:
    """The issue's part-1 targets; ``met`` None where a figure is missing (or, on the CPU, meaningless)."""
    def get(name: str, key: str) -> float | None:
        return systems.get(name, {}).get(key)

    out = []
    for st in range(3):
        out.append(_target(f"MFU zerorun-z{st} >= 0.50", get(f"zerorun-z{st}", "mfu"), 0.50, below=False))
    for st in range(4):
        zr, ds = get(f"zerorun-z{st}", "step_s"), get(f"ds-z{st}", "step_s")
        out.append(_target(f"step zerorun-z{st} <= 0.90x ds-z{st}", zr / ds if zr and ds else None, 0.90))
    zr3, fsdp = get("zerorun-z3", "step_s"), get("fsdp2", "step_s")
    out.append(_target("step zerorun-z3 <= 1.0x fsdp2", zr3 / fsdp if zr3 and fsdp else None, 1.0))
    for st in range(4):
        zr, ds = get(f"zerorun-z{st}", "peak_over_baseline"), get(f"ds-z{st}", "peak_over_baseline")
        out.append(_target(f"peak allocated zerorun-z{st} <= ds-z{st}", zr / ds if zr and ds else None, 1.0))
    if cpu:  # the dry mode's times say nothing about a GPU
        for t in out:
            t["met"] = None
    return out


def _throughput(part: dict[str, Any], peak: str | None) -> list[str]:
    lines = [f"## 1. Throughput, world 1 (MFU = 6 x P x tokens / step time / {peak or 'no peak: CPU'})", "",
             "| system | params | step s | tokens/s | MFU | max allocated GB (over baseline) | max reserved GB | "
             "optimizer | loss first -> last |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, r in part.get("systems", {}).items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:120]} |||||||| ")
            continue
        loss = f"{r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}"
        lines.append(f"| {name} | {r['params']:,} | {_f(r['step_s'])} | {_f(r['tokens_per_s'], '{:,.0f}')} | "
                     f"{_f(r.get('mfu'), '{:.1%}')} | {_f(r['max_memory_allocated'] and r['max_memory_allocated'] / GB)} "
                     f"({_f(r.get('peak_over_baseline') and r['peak_over_baseline'] / GB)}) "
                     f"| {_f(r['max_memory_reserved'] and r['max_memory_reserved'] / GB)} | {r['optimizer']} | {loss} |")
    agree = part.get("losses", {})
    lines += ["", f"Loss curves against {agree.get('reference')}: worst relative difference per system "
              f"{ {k: round(v, 5) for k, v in (agree.get('worst') or {}).items()} } (tolerance {agree.get('rtol')}): "
              f"{'within' if agree.get('passed') else 'NOT within'}."]
    for name, child in part.get("children", {}).items():
        if child.get("timed_out") or child.get("returncode"):
            state = "ran out of its time" if child.get("timed_out") else f"exited {child['returncode']}"
            lines.append(f"The {name} child {state}: its systems that finished are above, the others are missing.")
    if part.get("deepspeed"):
        lines.append(f"DeepSpeed {part['deepspeed']}")
    if part.get("ds_optimizer"):
        lines.append(f"DeepSpeed's optimizer: {part['ds_optimizer']}.")
    for name, r in part.get("systems", {}).items():
        prof = r.get("profile")
        if prof and prof.get("device_busy_s") is not None:
            kernels = ", ".join(f"{k['name']} {k['self_device_ms']:.1f} ms" for k in prof["top"][:5])
            lines.append(f"- {name}, one profiled step: {prof['wall_s']:.3f} s wall, device busy "
                         f"{prof['device_busy_s']:.3f} s, host gaps {prof['host_gap_s']:.3f} s; top: {kernels}")
    lines += ["", "| target | measured | met |", "|---|---:|---|"]
    for t in part.get("targets", []):
        lines.append(f"| {t['target']} | {_f(t['measured'])} | {'-' if t['met'] is None else ('yes' if t['met'] else 'MISSED')} |")
    return lines


def _offload(part: dict[str, Any]) -> list[str]:
    lines = [f"## 2. Largest model with offload, the card capped at {part.get('card_gib')} GiB "
             f"(width {part.get('width')}, {part.get('params_per_layer', 0):,} parameters a layer; host available "
             f"{_f(part.get('host_available', 0) / GB, '{:.0f}')} GB, disk free {_f(part.get('disk_free', 0) / GB, '{:.0f}')} GB)",
             "", f"DeepSpeed's optimizer: {part.get('ds_optimizer')}. First probes (zerorun's estimate): {part.get('starts')}.",
             "", "| search | probes (depth: fit, step s, peak GB / estimate GB) | largest depth | bracket closed |",
             "|---|---|---:|---|"]
    for key, res in part.get("searches", {}).items():
        probes = "; ".join(
            f"{p['depth']}: {'yes' if p.get('fits') else ('?' if p.get('unknown') else 'no')}"
            + (f", {p['step_s']:.2f} s" if p.get("step_s") else "")
            + (f", {p['max_memory_allocated'] / GB:.1f} / {p['estimate_total_no_overhead'] / GB:.1f}"
               if p.get("max_memory_allocated") and p.get("estimate_total_no_overhead") else "")
            for p in res["probes"])
        stopped = f" (stopped: {res['stopped'][:100]})" if res.get("stopped") else ""
        lines.append(f"| {key} | {probes or '-'} | {_f(res['largest_depth'], '{}')} | {res['closed']}{stopped} |")
    lines += ["", "| placement | zerorun largest params | DeepSpeed largest params | ratio (target >= 1.5) | "
              "step s at DeepSpeed's largest: zerorun / DeepSpeed | ratio (target <= 0.70) |", "|---|---:|---:|---:|---|---:|"]
    for placement, c in part.get("compare", {}).items():
        lines.append(f"| {placement} | {_f(c.get('zerorun_largest_params'), '{:,}')} | "
                     f"{_f(c.get('ds_largest_params'), '{:,}')} | {_f(c.get('largest_ratio'), '{:.2f}')} | "
                     f"{_f(c.get('zerorun_step_s'))} / {_f(c.get('ds_step_s'))} | {_f(c.get('step_ratio'), '{:.2f}')} |")
    return lines


def _kernels(part: dict[str, Any]) -> list[str]:
    lines = ["## 3. Kernels", ""]
    q = part.get("quant", {})
    for name in ("qwZ", "qgZ"):
        r = q.get(name)
        if r:
            lines.append(f"- {name}: quantize {r['quantize_GBps']:.1f} GB/s, dequantize {r['dequantize_GBps']:.1f} GB/s; "
                         f"int8 values differing from the CPU's {r['values_differing']} (max {r['max_value_diff']}), "
                         f"error / bound {r['max_err_over_bound']:.3f}: {'ok' if r['passed'] else 'FAILED'}")
    h, ds = part.get("host_step", {}), part.get("DeepSpeedCPUAdam", {})
    if "ns_per_param" in h:
        lines.append(f"- host AdamW step, {h['numel']:,} fp32 elements, {h['threads']} threads, ns/parameter: "
                     + ", ".join(f"{k} {v:.2f}" for k, v in h["ns_per_param"].items())
                     + (f", DeepSpeedCPUAdam {ds['ns_per_param']:.2f}" if "ns_per_param" in ds else
                        f"; DeepSpeedCPUAdam: {ds.get('skipped') or ds.get('error', 'no figure')}"))
    c = part.get("compensated", {})
    if "kahan" in c:
        lines.append("- bf16 masters, updates below half an ulp: fraction of the fp32 move kept: "
                     + ", ".join(f"{m} {c[m]['kept_of_fp32_move']:.3f} ({c[m]['GBps']:.1f} GB/s)"
                                 for m in ("nearest", "kahan", "stochastic_rounding")))
    n = part.get("nvme", {})
    if "swapper_write_GBps" in n:
        lines.append(f"- NVMe ({n['path']}): swapper write {n['swapper_write_GBps']:.2f} / read {n['swapper_read_GBps']:.2f} "
                     f"GB/s ({n['workers']} threads; {n['read_note']}); dd write {n['dd_write_GBps']:.2f} / read "
                     f"{n['dd_read_GBps']:.2f} GB/s")
    for name in ("quant", "host_step", "compensated", "nvme"):
        if part.get(name, {}).get("error"):
            lines.append(f"- {name}: error {part[name]['error'][:200]}")
    return lines


def markdown(summary: dict[str, Any]) -> str:
    env = summary.get("env", {})
    lines = [f"# zerorun beside FSDP2 and DeepSpeed on one GPU ({summary.get('mode')} mode)", "",
             f"{env.get('gpu', 'CPU (dry mode)')}; python {env.get('python')}, torch {env.get('torch')} "
             f"(CUDA {env.get('cuda')}), {env.get('cpus')} host cores; DeepSpeed: "
             f"{env.get('deepspeed_python') or env.get('deepspeed_skipped')}; {summary.get('seconds')} s.", ""]
    parts = summary.get("parts", {})
    render = {"throughput": lambda p: _throughput(p, env.get("peak")), "offload": _offload, "kernels": _kernels}
    for name, part in parts.items():
        if "error" in part and len(part) <= 4:
            lines += [f"## {name}: error", "", f"    {part['error']}", ""]
            continue
        try:
            lines += render[name](part)
        except (KeyError, TypeError, ValueError) as e:  # a partial part still leaves its JSON
            lines.append(f"({name}: table not rendered: {type(e).__name__}: {e}; see summary.json)")
        lines += ["", f"({name}: {part.get('seconds')} s of its {part.get('budget_s')} s budget)", ""]
    return "\n".join(lines) + "\n"
