"""The DeepSpeed-style test script on real DeepSpeed and on zerorun (--as_deepspeed), step by step.

Needs a DeepSpeed venv (see shared/peers/README.md; DeepSpeed is never a zerorun dependency):

    python bench/ds_compat_parity.py --ds-python /path/to/ds-venv/bin/python [--stages 0,1,2,3]

For each ZeRO stage it runs tests/compat_scripts/ds_classifier.py, unchanged, on 2 CPU ranks
twice: with DeepSpeed (its torchrun, DS_ACCELERATOR=cpu) and with `zerorun --as_deepspeed`,
from the same ds.json (no gradient_clipping key: each system's default; a WarmupLR schedule;
AdamW with torch_adam so DeepSpeed needs no compiled op). It prints, per stage, the largest
loss and parameter differences. The script writes the per-step mean loss and the final
parameters (gathered at stage 3).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "compat_scripts" / "ds_classifier.py"


def config(stage: int) -> dict:
    return {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01, "torch_adam": True}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.05,
                                                         "warmup_num_steps": 3, "warmup_type": "linear"}},
            "zero_optimization": {"stage": stage}}


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads((cwd / "result.json").read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ds-python", required=True, help="python of a venv with DeepSpeed installed")
    p.add_argument("--stages", default="0,1,2,3")
    args = p.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZERORUN_AS_DEEPSPEED")}
    base["OMP_NUM_THREADS"] = "1"
    worst = 0.0
    for stage in (int(s) for s in args.stages.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            (cwd / "ds.json").write_text(json.dumps(config(stage)))
            script = [str(SCRIPT), "--deepspeed", "--deepspeed_config", "ds.json", "--out", "result.json"]
            ds = run([args.ds_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                      *script], cwd, {**base, "DS_ACCELERATOR": "cpu"})
            zr = run([sys.executable, "-m", "zerorun.cli", "--as_deepspeed", "--num_gpus", "2", "--master_port",
                      "auto", *script], cwd, base)
        dl = max(abs(a - b) for a, b in zip(ds["losses"], zr["losses"], strict=True))
        dp = max(abs(a - b) for pa, pb in zip(ds["params"], zr["params"], strict=True)
                 for a, b in zip(pa, pb, strict=True))
        worst = max(worst, dl, dp)
        print(json.dumps({"stage": stage, "max_loss_diff": dl, "max_param_diff": dp, "deepspeed_losses": ds["losses"],
                          "zerorun_losses": zr["losses"], "lr_after": [ds["lr"], zr["lr"]]}))
    print(f"worst difference {worst:.3g}")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
