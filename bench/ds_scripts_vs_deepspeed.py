"""The example DeepSpeed scripts of tests/ds_scripts/ on DeepSpeed itself and on `zerorun --as-deepspeed`,
losses compared step by step, with each run's peak resident memory per rank and its time
(not part of the test suite: it needs a DeepSpeed install).

    python bench/ds_scripts_vs_deepspeed.py --ds-venv .venv-ds                 # every case
    python bench/ds_scripts_vs_deepspeed.py --ds-venv .venv-ds --cases clm-z2,clm-z3
    python bench/ds_scripts_vs_deepspeed.py --ds-venv .venv-ds --json out.json

DeepSpeed runs under its own launcher (`deepspeed --num_gpus 2`, DS_ACCELERATOR=cpu, gloo),
zerorun under `zerorun --as-deepspeed --num_gpus 2`, with the same script, arguments and
config. The first DeepSpeed run JIT-compiles its CPU ops (a minute or more). The TRL cases
start from one tiny Llama saved here (tests/ds_scripts/tiny_llama.py) and need trl, peft
and datasets in both environments. Peak memory: the kernel's VmHWM of each rank process
(bench/rank_peaks.py), the largest over the ranks; time: the launch's wall clock, start-up
included.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rank_peaks import RankPeaks

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "ds_scripts"
TRAINER = ("--max_steps", "5", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
           "--learning_rate", "3e-3", "--warmup_steps", "2", "--weight_decay", "0.01", "--seed", "7",
           "--num_samples", "40", "--per_device_train_batch_size", "2",
           # without a GPU, accelerate joins a multi-process DeepSpeed run only from the state run_clm.py sets up
           "--accelerator_config", '{"use_configured_state": true}')


# the TRL scripts: 4 steps of a global batch of 4 (the values of tests/scripts/test_ds_scripts_trl.py); TRL's configs
# default to bf16 and gradient checkpointing, so both are always given
TRL = ("--model_name_or_path", "{ckpt}", "--output_dir", "{out}", "--max_steps", "4", "--logging_steps", "1",
       "--save_strategy", "no", "--report_to", "none", "--learning_rate", "1e-2", "--warmup_steps", "0",
       "--seed", "7", "--num_samples", "32", "--per_device_train_batch_size", "2",
       "--accelerator_config", '{"use_configured_state": true}')
FP32, NO_GC = ("--bf16", "false"), ("--gradient_checkpointing", "false")


def _gc(reentrant: bool) -> list[str]:
    return ["--gradient_checkpointing", "true", "--gradient_checkpointing_kwargs",
            json.dumps({"use_reentrant": reentrant})]


def _trl_cases() -> dict[str, tuple[str, list[str], dict[str, Any] | None]]:
    def case(script: str, stage: int, *args: str) -> tuple[str, list[str], None]:
        return script, ["--deepspeed", str(SCRIPTS / f"ds_config_zero{stage}.json"), *args, *TRL], None

    return {
        "sft-z3": case("trl_sft.py", 3, *FP32, *NO_GC),
        "sft-gc-z3": case("trl_sft.py", 3, *FP32, *_gc(reentrant=False)),
        "sft-bf16-z3": case("trl_sft.py", 3, "--bf16", "true", "--use_cpu", *NO_GC),
        "sft-lora-gc-z3": case("trl_sft.py", 3, *FP32, "--use_peft", *_gc(reentrant=True)),
        "dpo-z2": case("trl_dpo.py", 2, *FP32, *NO_GC),
        "dpo-z3": case("trl_dpo.py", 3, *FP32, *NO_GC),
        "gen-z3": case("trl_sft.py", 3, *FP32, *NO_GC, "--generate_every", "2"),
    }


def _cifar_config(stage: int) -> dict[str, Any]:
    return {"train_batch_size": 8, "steps_per_print": 2000, "gradient_clipping": 1.0,
            "optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.8, 0.999], "eps": 1e-8}},
            "zero_optimization": {"stage": stage}}


def _longtail_config(stage: int, autocast: bool) -> dict[str, Any]:
    config: dict[str, Any] = {"train_batch_size": 8, "steps_per_print": 2000, "gradient_clipping": 0.0,
                              "zero_optimization": {"stage": stage}}
    if autocast:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    return config


def _gan_config(stage: int) -> dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage}}


def cases() -> dict[str, tuple[str, list[str], dict[str, Any] | None]]:
    """name -> (script, arguments ({cfg} = the written config, {out} = the output dir), config or None)."""
    out: dict[str, tuple[str, list[str], dict[str, Any] | None]] = {}
    for stage in range(4):
        out[f"cifar-z{stage}"] = ("cifar10_deepspeed.py", ["--deepspeed", "--deepspeed_config", "{cfg}",
                                  "--samples", "48", "--out_dir", "{out}"], _cifar_config(stage))
        out[f"gan-z{stage}"] = ("gan_deepspeed_train.py", ["--deepspeed", "--deepspeed_config", "{cfg}",
                                "--samples", "32", "--out_dir", "{out}"], _gan_config(stage))
        out[f"bert-z{stage}"] = ("train_bert_ds.py", ["--zero_stage", str(stage), "--num_iterations", "6",
                                 "--checkpoint_every", "100", "--out_dir", "{out}"], None)
    for stage in (1, 2, 3):  # a top-level MoE import, an op-builder probe, safe_get_full_grad, offload_states
        # (DeepSpeed's stage-3 offload_states asserts its CUDA FusedAdam, which a CPU run cannot build)
        offload = ["--offload_states"] if stage < 3 else []
        out[f"longtail-z{stage}"] = ("longtail_deepspeed.py", ["--deepspeed", "--deepspeed_config", "{cfg}",
                                     "--samples", "48", *offload, "--out_dir", "{out}"],
                                     _longtail_config(stage, autocast=False))
        out[f"autocast-z{stage}"] = ("longtail_deepspeed.py", ["--deepspeed", "--deepspeed_config", "{cfg}",
                                     "--samples", "48", "--out_dir", "{out}"],
                                     _longtail_config(stage, autocast=True))
    for stage in (2, 3):
        out[f"clm-z{stage}"] = ("run_clm.py", ["--deepspeed", str(SCRIPTS / f"ds_config_zero{stage}.json"),
                                "--output_dir", "{out}", *TRAINER], None)
        out[f"accelerate-z{stage}"] = ("accelerate_deepspeed.py", ["--zero_stage", str(stage), "--samples", "48",
                                       "--out_dir", "{out}"], None)
    return {**out, **_trl_cases()}


def _checkpoint(path: Path) -> Path:
    """The tiny Llama every TRL case starts from (built once, with this environment's transformers)."""
    sys.path.insert(0, str(SCRIPTS))
    from tiny_llama import save_tiny_llama

    return save_tiny_llama(path)


def _read_losses(out: Path) -> list[float]:
    """Per step: the Trainer's logged loss, or the mean over ranks of each rank's losses (GAN: Loss_D, Loss_G)."""
    history = out / "log_history.json"
    if history.exists():
        return [e["loss"] for e in json.loads(history.read_text())]
    ranks = [json.loads(p.read_text())["losses"] for p in sorted(out.glob("losses_rank*.json"))]
    ranks = [list(r.values()) if isinstance(r, dict) else r for r in ranks]
    flat = [[x for v in r for x in (v if isinstance(v, list) else [v])] for r in ranks]  # GAN: D, G per step
    return [sum(vals) / len(vals) for vals in zip(*flat, strict=True)]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _fill(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace(key, value)
    return arg


def run_case(system: str, launcher: list[str], env: dict[str, str], script: str, args: list[str],
             config: dict[str, Any] | None, timeout: float, ckpt: str) -> dict[str, Any]:
    """One launch: its losses (None if it failed), the error's tail, peak bytes per rank, seconds."""
    with tempfile.TemporaryDirectory(prefix=f"{system}-") as tmp:
        out = Path(tmp)
        cfg = out / "ds_config.json"
        if config is not None:
            cfg.write_text(json.dumps(config))
        port = _free_port()  # DeepSpeed's launcher would take 29500 and collide with any other job there
        fill = {"{port}": port, "{cfg}": str(cfg), "{out}": str(out), "{ckpt}": ckpt}  # not str.format: JSON
        argv = [_fill(a, fill) for a in [*launcher, str(SCRIPTS / script), *args]]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peaks = RankPeaks(proc.pid, script)
        peaks.start()
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            output = f"timed out after {timeout:.0f} s"
        finally:
            peaks.stop()
        row = {"seconds": time.perf_counter() - start, "peak_bytes": peaks.peaks(), "losses": None, "error": ""}
        if proc.returncode != 0:
            row["error"] = output[-2500:]
        else:
            row["losses"] = _read_losses(out)
        return row


def _mib(peaks: dict[int, int]) -> str:
    return f"{max(peaks.values()) / 2**20:.0f}" if peaks else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ds-venv", type=Path, required=True, help="virtual environment with deepspeed installed")
    parser.add_argument("--cases", default=",".join(cases()), help="comma-separated case names")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ns = parser.parse_args()
    base = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
            "TOKENIZERS_PARALLELISM": "false"}
    ds_bin = ns.ds_venv.resolve() / "bin"
    systems = {
        "deepspeed": ([str(ds_bin / "deepspeed"), "--num_gpus", "2", "--master_port", "{port}"],
                      {**base, "PATH": f"{ds_bin}:{base['PATH']}"}),  # its JIT ops cache keys on the ninja found
        "zerorun": ([sys.executable, "-m", "zerorun.cli", "--as_deepspeed", "--num_gpus", "2",
                     "--master_port", "auto"], base),
    }
    table, figures, lines = cases(), {}, []
    names = ns.cases.split(",")
    with tempfile.TemporaryDirectory(prefix="ckpt-") as ckpt_dir:
        ckpt = str(_checkpoint(Path(ckpt_dir))) if any("{ckpt}" in table[n][1] for n in names) else ""
        for name in names:
            script, args, config = table[name]
            row: dict[str, Any] = {}
            for system, (launcher, env) in systems.items():
                row[system] = run_case(system, launcher, env, script, args, config, ns.timeout, ckpt)
                if row[system]["error"]:
                    print(f"{name} on {system} failed:\n{row[system]['error']}", file=sys.stderr)
            ds, zr = row["deepspeed"]["losses"], row["zerorun"]["losses"]
            if ds and zr and len(ds) == len(zr):
                row["max_abs_diff"] = max(abs(a - b) for a, b in zip(ds, zr, strict=True))
                row["max_rel_diff"] = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ds, zr, strict=True))
            figures[name] = row
            diff = row.get("max_abs_diff")
            print(f"{name:14s} steps={len(ds or zr or [])}  max |dloss| = {'n/a' if diff is None else f'{diff:.1e}'}"
                  f"  (relative {row.get('max_rel_diff', float('nan')):.1e})", flush=True)
            for system in systems:
                r = row[system]
                print(f"    {system:9s} {' '.join(f'{v:.7f}' for v in r['losses'] or [])}  peak/rank "
                      f"{_mib(r['peak_bytes'])} MiB  {r['seconds']:.1f} s")
            lines.append(f"| {name} | {len(ds or zr or [])} | {'n/a' if diff is None else f'{diff:.1e}'} | "
                         f"{_mib(row['zerorun']['peak_bytes'])} | {_mib(row['deepspeed']['peak_bytes'])} | "
                         f"{row['zerorun']['seconds']:.1f} | {row['deepspeed']['seconds']:.1f} |")
    print("\n| case | steps | max abs loss diff | zerorun peak MiB/rank | DeepSpeed peak MiB/rank | zerorun s | "
          "DeepSpeed s |\n|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    if ns.json:
        ns.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
