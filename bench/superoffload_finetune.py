"""DeepSpeed-SuperOffload's ``finetune_zero3.py`` (DeepSpeedExamples) on DeepSpeed and on zerorun, offload to cpu.

    python bench/superoffload_finetune.py --script DeepSpeedExamples/training/DeepSpeed-SuperOffload/finetune_zero3.py \\
        --ds-python /path/to/venv-with-deepspeed-transformers-datasets/bin/python --stage 2 --repeat 2

The script is run as it is published (not copied here), with the same arguments and config
on both: 2 CPU ranks (gloo), ZeRO ``--stage`` with ``offload_optimizer: cpu``, bf16 as the
script loads the model, its own optimizer (``deepspeed.ops.adam.DeepSpeedCPUAdam``: DeepSpeed's
AVX kernel there, zerorun's fused torch kernel here). DeepSpeed runs under torchrun, zerorun
under ``zerorun --as_deepspeed``. Nothing is downloaded: the model is the tiny Llama of
tests/ds_scripts/tiny_llama.py (``--hidden``, ``--layers``), the dataset an Alpaca-format JSON
file of counting sequences, and ``wandb`` (imported by the script, unused without
``--use_wandb``) a stub module on PYTHONPATH. Reported: the median of the script's own
"Time: N ms" per step after its warm-up steps, for each run, and every rank's loss at the last step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"Step\s+(\d+) \| Loss: ([0-9.]+) \| Time:\s+([0-9.]+)ms")


def _inputs(tmp: Path, hidden: int, layers: int) -> tuple[Path, Path, Path]:
    sys.path.insert(0, str(ROOT / "tests" / "ds_scripts"))
    from tiny_llama import save_tiny_llama

    model = save_tiny_llama(tmp / "model", hidden=hidden, layers=layers)
    data = tmp / "data"
    data.mkdir()
    rows = [{"instruction": f"{a} {a + d}", "input": "", "output": " ".join(str(a + k * d) for k in range(2, 12))}
            for a in range(0, 20) for d in (1, 2, 3)]
    (data / "train.json").write_text("\n".join(json.dumps(r) for r in rows))
    stub = tmp / "stub"
    stub.mkdir()
    (stub / "wandb.py").write_text('"""A stand-in: the script imports wandb; nothing here calls it."""\n')
    return model, data, stub


def _config(stage: int, batch: int, path: Path) -> Path:
    cfg = {"train_batch_size": 2 * batch, "train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
           "bf16": {"enabled": True}, "gradient_clipping": 0.0, "steps_per_print": 10**6,
           "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    path.write_text(json.dumps(cfg))
    return path


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _run_group(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` in a process group of its own, its output captured; past ``timeout`` the whole group is
    stopped (SIGTERM, SIGKILL 30 s later): killing torchrun alone would leave its ranks running."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            raise SystemExit(f"{argv[0]} ran past --timeout {timeout:g} s: its process group was stopped") from None
        finally:
            _killpg(proc.pid, signal.SIGKILL)  # a rank that outlived its launcher, whatever the outcome
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run(system: str, argv: list[str], env: dict[str, str], cwd: Path, timeout: float, warmup: int) -> dict:
    proc = _run_group(argv, env, cwd, timeout)
    steps = [(int(m[1]), float(m[2]), float(m[3])) for m in STEP.finditer(proc.stdout + proc.stderr)]
    if proc.returncode != 0 or not steps:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise SystemExit(f"{system} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    timed = [t for n, _, t in steps if n > warmup]
    last = max(n for n, _, _ in steps)  # every rank's loss of the last step (the lines do not all name the rank)
    return {"system": system, "step_ms_median": statistics.median(timed), "step_ms_min": min(timed),
            "losses": [loss for _, loss, _ in steps], "last_losses": sorted({loss for n, loss, _ in steps if n == last})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", type=Path, required=True, help="finetune_zero3.py of a DeepSpeedExamples checkout")
    p.add_argument("--ds-python", required=True, help="a Python with deepspeed, transformers and datasets")
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=1, help="runs per system, alternated")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="superoffload-") as d:
        tmp = Path(d)
        model, data, stub = _inputs(tmp, args.hidden, args.layers)
        cfg = _config(args.stage, args.batch, tmp / "ds_config.json")
        script_args = [str(args.script.resolve()), "--model_name", str(model), "--lr", "1e-3", "--batch_size",
                       str(args.batch), "--output_dir", str(tmp / "out"), "--attn_implementation", "eager",
                       "--max_length", str(args.max_length), "--dataset_name", str(data), "--warmup_steps",
                       str(args.warmup), "--bench_steps", str(args.steps), "--seed", "42",
                       "--deepspeed", "--deepspeed_config", str(cfg)]
        base = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(stub), os.environ.get("PYTHONPATH")]))}
        ds_bin = str(Path(args.ds_python).parent)
        systems = {
            "deepspeed": ([args.ds_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *script_args], {**base, "PATH": f"{ds_bin}:{base['PATH']}"}),
            "zerorun": ([sys.executable, "-m", "zerorun.cli", "--as_deepspeed", "--num_gpus", "2",
                         "--master_port", "auto", *script_args], base),
        }
        rows = []
        for rep in range(args.repeat):
            for name, (argv, env) in systems.items():
                rows.append({**run(name, argv, env, tmp, args.timeout, args.warmup), "repeat": rep})
                print(json.dumps(rows[-1]), flush=True)
    print(f"finetune_zero3.py, stage {args.stage}, offload_optimizer cpu, 2 CPU ranks, tiny Llama "
          f"hidden {args.hidden} x {args.layers} layers, bf16, batch {args.batch}/rank, length {args.max_length}:")
    print("| run | system | step ms (median) | step ms (min) | last step's losses (the ranks') |\n|---|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['repeat'] + 1} | {r['system']} | {r['step_ms_median']:.0f} | {r['step_ms_min']:.0f} | "
              f"{', '.join(f'{x:.4f}' for x in r['last_losses'])} |")


if __name__ == "__main__":
    main()
