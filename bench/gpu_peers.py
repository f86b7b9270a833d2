"""``scripts/gpu_check.sh --peers``: zerorun beside FSDP2 and DeepSpeed 0.19.8 on one GPU, in one call.

    bash scripts/gpu_check.sh --peers --out DIR          # one GPU: DIR/summary.json and DIR/summary.md
    bash scripts/gpu_check.sh --peers --cpu --out DIR    # dry mode: every part tiny on CPU/gloo
    bash scripts/gpu_check.sh --peers --parts offload    # one part again (throughput, offload, kernels)

Parts, each with its own time budget (:data:`BUDGET_S`, seconds; the whole call stops at
:data:`LIMIT_S`), each in child processes, so a part that fails or runs out of time leaves the
others' figures (its error is in ``summary.json``):

1. ``throughput``: world 1, a ~0.95B Llama-shaped decoder (bench/gpu_peers_model.py), bf16,
   4 x 2048 tokens, activation checkpointing; zerorun stages 0-3 and FSDP2 in one child,
   DeepSpeed stages 0-3 in another; step time, tokens/s, MFU against the card's named dense bf16
   peak, ``max_memory_allocated``/``reserved``, the loss curves against zerorun stage 0's.
2. ``kernels``: qwZ/qgZ, the host step against DeepSpeedCPUAdam, bf16 compensation, NVMe against dd
   (bench/gpu_peers_kernels.py).
3. ``offload``: the largest depth each system trains under a 24 GiB cap (bench/gpu_peers_offload.py),
   last: its probes (5-7B models, a fresh process each) take what is left of the call.

DeepSpeed: the Python in ``DS_PYTHON`` (default: this one). On a GPU machine without it, the
wheels of ``scripts/device_wheels.sh`` (``.device-wheels/``, carried with the checkout) are
installed with ``pip --no-index``. Its compiled ops are JIT-built in the background while part 1
runs: FusedAdam where the machine has nvcc, DeepSpeedCPUAdam where it has a C++ compiler; a
system whose op is not built by the time it starts uses DeepSpeed's documented ``torch_adam``
instead, and the summary says which. Where DeepSpeed is not importable its rows are skipped
with one line saying so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
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

from bench import gpu_peers_model as M  # noqa: E402
from bench import gpu_peers_offload as O  # noqa: E402
from bench.gpu_peers_report import markdown, throughput_targets  # noqa: E402

LIMIT_S = 350  # scripts/gpu_check.sh --peers stops the call at 360 s
CPU_LIMIT_S = 340  # the dry mode on a loaded 2-core machine
# part 2 goes last and takes what is left of the call (its probes of 5-7B models are the slow ones)
BUDGET_S = {"throughput": 100, "kernels": 50, "offload": LIMIT_S}
CPU_BUDGET_S = {"throughput": 150, "kernels": 90, "offload": 100}
CARD_GIB = 24
WHEELS = ROOT / ".device-wheels"
DS_OPS_CODE = """
import json, sys, time
out = {}
from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder
for name, builder in (("cpu_adam", CPUAdamBuilder), ("fused_adam", FusedAdamBuilder)):
    t0 = time.time()
    try:
        builder().load()
        out[name] = {"built": True, "seconds": time.time() - t0}
    except BaseException as e:
        out[name] = {"built": False, "seconds": time.time() - t0, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    open(sys.argv[1], "w").write(json.dumps(out))
"""


class Run:
    """One call's shared state: mode, pythons, scratch folder, the summary written after each part."""

    def __init__(self, cpu: bool, out: Path, scratch: Path, limit: float | None = None) -> None:
        self.cpu, self.out, self.scratch = cpu, out, scratch
        self.started = time.monotonic()
        self.limit = limit or (CPU_LIMIT_S if cpu else LIMIT_S)
        self.summary: dict[str, Any] = {"mode": "cpu" if cpu else "cuda", "parts": {}}
        self.ds_python: str | None = None
        self.builder: subprocess.Popen[bytes] | None = None  # DeepSpeed's op builds, in the background
        self.port = 29600
        self.ops_file = scratch / "ds-ops.json"
        self.env = {**os.environ, "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                                        str(scratch / "torch-extensions"))}
        if cpu:  # one thread a child: the dry mode runs on a 2-core machine beside other jobs
            self.env |= {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}

    def left(self) -> float:
        return self.limit - (time.monotonic() - self.started)

    def write(self) -> None:
        self.summary["seconds"] = round(time.monotonic() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2, default=str))
        (self.out / "summary.md").write_text(markdown(self.summary))

    def child(self, python: str, argv: list[str], timeout: float) -> dict[str, Any]:
        """A child to its end or its time; its return code, the tail of its output, whether it timed out."""
        self.port += 1
        env = {**self.env, "MASTER_PORT": str(self.port)}
        try:
            done = subprocess.run([python, *argv], env=env, capture_output=True, text=True, timeout=max(1, timeout),
                                  cwd=ROOT)
            return {"returncode": done.returncode, "timed_out": False, "tail": (done.stdout + done.stderr)[-1500:]}
        except subprocess.TimeoutExpired as e:
            tail = (e.stdout or b"")[-1500:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-1500:]
            return {"returncode": None, "timed_out": True, "tail": str(tail)}

    def ds_ops(self) -> dict[str, Any]:
        """What the background build of DeepSpeed's ops has finished so far (nothing on the CPU run)."""
        try:
            return json.loads(self.ops_file.read_text())
        except (OSError, ValueError):
            return {}


def _importable(python: str, module: str, env: dict[str, str]) -> bool:
    """Whether ``python`` finds ``module`` (found, not imported: no torch import for the question)."""
    if python == sys.executable:
        importlib.invalidate_caches()  # a pip install in this run adds it after the finders cached the folders
        return importlib.util.find_spec(module) is not None
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", code], env=env, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def setup(run: Run) -> dict[str, Any]:
    """The machine, torch, and a DeepSpeed to run (installed from the carried wheels on a GPU machine)."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cpus": os.cpu_count(), "numpy": _importable(
                                sys.executable, "numpy", run.env)}
    if not run.cpu:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["peak_tflops"], info["peak"] = M.peak_tflops(info["gpu"])
        info["gpu_memory"] = torch.cuda.get_device_properties(0).total_memory
    try:
        import psutil

        info["host_memory"] = psutil.virtual_memory().total
        info["host_available"] = psutil.virtual_memory().available
    except ImportError:
        info["host_memory"] = info["host_available"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    info["disk_free"] = shutil.disk_usage(run.scratch).free
    print(f"python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}), "
          f"{info.get('gpu', 'CPU dry mode')}", flush=True)
    python = os.environ.get("DS_PYTHON") or sys.executable
    if not _importable(python, "deepspeed", run.env) and not run.cpu and WHEELS.is_dir():
        pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS),
                              "deepspeed==0.19.8", "pyyaml", "typer", "rich", "psutil", "pydantic", "hjson",
                              "nvidia-ml-py"], env={**run.env, "PIP_BREAK_SYSTEM_PACKAGES": "1"},
                             capture_output=True, text=True, timeout=max(5, run.left() - 300))
        info["ds_install"] = {"returncode": pip.returncode, "tail": (pip.stdout + pip.stderr)[-1500:]}
    if _importable(python, "deepspeed", run.env):
        run.ds_python = python
        if not run.cpu:  # its ops compile on the host's cores while part 1 keeps the GPU busy
            run.builder = subprocess.Popen([python, "-c", DS_OPS_CODE, str(run.ops_file)],
                                           env={**run.env, "MAX_JOBS": "8"}, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, cwd=ROOT)
    else:
        info["deepspeed_skipped"] = ("DeepSpeed is not importable in " + python + ": its rows are skipped "
                                     "(set DS_PYTHON, or carry .device-wheels/ from scripts/device_wheels.sh)")
        print(f"SKIP DeepSpeed: {info['deepspeed_skipped']}", flush=True)
    info["deepspeed_python"] = run.ds_python
    run.summary["env"] = info
    return info


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def part_throughput(run: Run, deadline: float) -> dict[str, Any]:
    steps = ["--warmup", "1", "--steps", "2"] if run.cpu else ["--warmup", "2", "--steps", "4", "--profile"]
    mode = ["--cpu"] if run.cpu else []
    families = [("zerorun", sys.executable, "zerorun-z0,zerorun-z1,zerorun-z2,zerorun-z3,fsdp2")]
    if run.ds_python:
        families.append(("ds", run.ds_python, "ds-z0,ds-z1,ds-z2,ds-z3"))
    out: dict[str, Any] = {"children": {}, "systems": {}}
    for name, python, systems in families:
        path = run.scratch / f"throughput-{name}.jsonl"
        extra = []
        if name == "ds":
            fused = run.ds_ops().get("fused_adam", {}).get("built")
            out["ds_optimizer"] = "FusedAdam (built in the background)" if fused else "torch_adam (torch.optim.AdamW)"
            extra = [] if fused else ["--torch-adam"]
        out["children"][name] = run.child(python, ["bench/gpu_peers_systems.py", "--systems", systems, *steps, *mode,
                                                   *extra, "--out", str(path)], deadline - time.monotonic())
        for line in _lines(path):
            if not line.get("header"):
                out["systems"][line["system"]] = line
    peak = run.summary["env"].get("peak_tflops")
    for row in out["systems"].values():
        if "step_s" in row:
            row["mfu"] = M.mfu(row["params"], row["tokens_per_step"], row["step_s"], peak)
    curves = {n: r["losses"] for n, r in out["systems"].items() if "losses" in r}
    out["losses"] = M.loss_agreement(curves)
    out["targets"] = throughput_targets(out["systems"], run.cpu)
    if not run.ds_python:
        out["deepspeed"] = "skipped: " + run.summary["env"]["deepspeed_skipped"]
    return out


def part_offload(run: Run, deadline: float) -> dict[str, Any]:
    env = run.summary["env"]
    shape = M.OFFLOAD_CPU if run.cpu else M.OFFLOAD_GPU
    hi = 2 if run.cpu else 64
    card = CARD_GIB * 2**30 - (0 if run.cpu else int(1.5 * 2**30))  # the estimate's fixed overhead off the card
    starts = {p: O.predicted_depth(shape, st, off, card, int(0.9 * env["host_available"]), int(0.9 * env["disk_free"]),
                                   hi) for p, (st, off) in O.PLACEMENTS.items()}
    swap = run.scratch / "nvme"
    systems = {"zerorun": sys.executable, "ds": run.ds_python}

    def probe_one(family: str, placement: str, depth: int, timeout: float, batch: list[str] | None = None) -> dict:
        python = systems[family]
        if python is None:
            return {"fits": False, "skipped": "DeepSpeed is not importable"}
        stage, offload = O.PLACEMENTS[placement]
        name = f"{family}-z{stage}@{offload}"
        path = run.scratch / f"offload-{family}-{placement}-{depth}.jsonl"
        argv = ["bench/gpu_peers_systems.py", "--systems", ",".join(batch or [name]), "--shape", "offload",
                "--layers", str(depth), "--warmup", "0", "--steps", "3", "--nvme", str(swap), "--out", str(path)]
        argv += ["--cpu"] if run.cpu else ["--mem-gib", str(CARD_GIB)]
        if family == "ds" and not run.ds_ops().get("cpu_adam", {}).get("built"):
            argv.append("--torch-adam")
        done = run.child(python, argv, timeout)
        lines = {r["system"]: r for r in _lines(path) if not r.get("header")}
        if name in lines:
            return lines[name]
        if done["timed_out"]:
            return {"fits": False, "unknown": True, "child": done}
        if done["returncode"] in (-9, 137):  # the kernel's OOM killer: the host's memory is the limit
            return {"fits": False, "oom": True, "host_oom": True, "child": done}
        return {"fits": False, "error": f"the probe's child exited {done['returncode']}", "child": done}

    swap.mkdir(exist_ok=True)
    if run.cpu:  # one child per family runs every placement at depth hi: the same code path, seconds not minutes
        for family in ("zerorun", "ds"):
            batch = [f"{family}-z{st}@{off}" for st, off in O.PLACEMENTS.values()]
            if systems[family]:
                probe_one(family, "stage2-cpu", hi, deadline - time.monotonic(), batch)

        def probe(family: str, placement: str, depth: int, timeout: float) -> dict[str, Any]:
            path = run.scratch / f"offload-{family}-stage2-cpu-{depth}.jsonl"
            stage, offload = O.PLACEMENTS[placement]
            found = {r["system"]: r for r in _lines(path) if not r.get("header")}
            if systems[family] is None:
                return {"fits": False, "skipped": "DeepSpeed is not importable"}
            return found.get(f"{family}-z{stage}@{offload}",
                             {"fits": False, "error": "no result: the child ran out of time or failed first"})
        results = O.search(probe, dict.fromkeys(O.PLACEMENTS, hi), 1, hi, time.monotonic() + 60, 60, max_rounds=1)
    else:
        results = O.search(probe_one, starts, 1, hi, deadline - 60, 90)  # 60 s kept for the comparison probes
    O.with_estimates(results, shape)
    compare = O.compare_at_ds_largest(results, probe_one, deadline, 90, shape)
    return {"card_gib": CARD_GIB, "width": shape.dim, "params_per_layer": shape.params_per_layer, "starts": starts,
            "host_available": env["host_available"], "disk_free": env["disk_free"], "searches": results,
            "compare": compare, "ds_optimizer": "DeepSpeedCPUAdam" if run.ds_ops().get("cpu_adam", {}).get("built")
            else "torch_adam (torch.optim.AdamW on the host)"}


def part_kernels(run: Run, deadline: float) -> dict[str, Any]:
    mode = ["--cpu"] if run.cpu else []
    path, ds_path = run.scratch / "kernels.json", run.scratch / "kernels-ds.json"
    numel = str(1 << 18 if run.cpu else 100_000_000)
    out: dict[str, Any] = {"child": run.child(sys.executable, ["bench/gpu_peers_kernels.py", *mode, "--numel", numel,
                                                               "--swap", str(run.scratch), "--out", str(path)],
                                              deadline - time.monotonic() - 20)}
    out |= json.loads(path.read_text()) if path.exists() else {}
    cpu_adam = run.ds_ops().get("cpu_adam", {})
    if run.ds_python and not run.cpu and not cpu_adam.get("built"):  # not waiting on (or killing) its build
        out["DeepSpeedCPUAdam"] = {"skipped": "its background build had not finished: "
                                   + (cpu_adam.get("error") or "still building")}
    elif run.ds_python:
        out["ds_child"] = run.child(run.ds_python, ["bench/gpu_peers_kernels.py", "--ds-adam", "--numel", numel,
                                                    "--out", str(ds_path)], deadline - time.monotonic())
        out["DeepSpeedCPUAdam"] = json.loads(ds_path.read_text()) if ds_path.exists() else {"error": "no result"}
    else:
        out["DeepSpeedCPUAdam"] = {"skipped": run.summary["env"]["deepspeed_skipped"]}
    return out


PARTS: dict[str, Callable[[Run, float], dict[str, Any]]] = {
    "throughput": part_throughput, "kernels": part_kernels, "offload": part_offload}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peers", action="store_true", help="(the entry point's switch; implied)")
    p.add_argument("--cpu", action="store_true", help="dry mode: every part tiny on CPU/gloo")
    p.add_argument("--out", type=Path, default=None, help="folder for summary.json and summary.md")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of: " + ", ".join(PARTS))
    p.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                   help="a part's time budget (e.g. offload=330 when it runs alone); the call's limit still holds")
    p.add_argument("--limit", type=float, default=None, help="the call's limit in seconds (default 350, dry mode "
                   "340; scripts/gpu_check.sh stops it at 360 whatever this says)")
    args = p.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device\nhint: run on a GPU machine, or pass --cpu for the dry mode")
    out = args.out or ROOT / "bench" / "results" / "gpu_peers" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    budgets = dict(CPU_BUDGET_S if args.cpu else BUDGET_S)
    for item in args.budget:
        name, _, seconds = item.partition("=")
        if name not in budgets or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"error: --budget {item!r}\nhint: PART=SECONDS with PART one of {', '.join(PARTS)}")
        budgets[name] = float(seconds)
    # the script's `timeout` sends SIGTERM: as an exception, so that subprocess.run kills the running child
    # and the scratch folder is removed (the parts written so far stay in summary.json)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="zerorun-peers-") as tmp:
        run = Run(args.cpu, out, Path(tmp), args.limit)
        try:
            _run_parts(run, args.parts.split(","), budgets)
        finally:
            if run.builder is not None and run.builder.poll() is None:
                run.builder.kill()
                run.builder.wait()
    print(f"summary: {out / 'summary.json'} and {out / 'summary.md'} ({run.summary['seconds']} s)", flush=True)
    return 1 if any("error" in r for r in run.summary["parts"].values()) else 0


def _run_parts(run: Run, names: list[str], budgets: dict[str, float]) -> None:
    setup(run)
    run.write()
    for name in names:
        t0 = time.monotonic()
        deadline = min(t0 + budgets[name], run.started + run.limit)
        try:
            result = PARTS[name](run, deadline)
        except Exception as e:  # a part that fails leaves the others' figures
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.monotonic() - t0, 1)
        result["budget_s"] = budgets[name]
        run.summary["parts"][name] = result
        run.write()
        print(f"{'ERROR' if 'error' in result else 'done '}  {name}  ({result['seconds']} s of {budgets[name]})",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
