"""zerorun's schedules (Warmup*, OneCycle, LRRangeTest) against DeepSpeed's own classes, step by step (needs DeepSpeed installed).

Run with a Python that has DeepSpeed (see shared/peers/README.md for the CPU venv), from the repo root:

    DS_ACCELERATOR=cpu /path/to/ds-venv/bin/python bench/ds_schedulers.py

For each case it prints the first mismatch (or "match") between the lr every optimizer step
uses under DeepSpeed (its scheduler as DeepSpeed's engine drives it: built, then stepped
after each optimizer step) and under zerorun's :class:`zerorun.engine.training.schedulers.Scheduler`.
The pinned figures in tests/compat/test_compat_schedulers.py were taken from this script's output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deepspeed.runtime import lr_schedules  # noqa: E402

from zerorun.engine.training.schedulers import build_scheduler  # noqa: E402

CASES = [
    ("WarmupLR", {"warmup_min_lr": 0.01, "warmup_max_lr": 0.1, "warmup_num_steps": 5, "warmup_type": "linear"}),
    ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 0.1, "warmup_num_steps": 5, "warmup_type": "log"}),
    ("WarmupLR", {"warmup_num_steps": 4}),  # warmup_max_lr: the optimizer's lr
    ("WarmupDecayLR", {"total_num_steps": 12, "warmup_min_lr": 0.0, "warmup_max_lr": 0.1, "warmup_num_steps": 4,
                       "warmup_type": "linear"}),
    ("WarmupCosineLR", {"total_num_steps": 12, "warmup_min_ratio": 0.1, "warmup_num_steps": 4,
                        "cos_min_ratio": 0.01, "warmup_type": "linear"}),
    ("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 3}),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 4, "cycle_second_step_size": 3,
                  "decay_step_size": 2, "decay_lr_rate": 0.5, "decay_mom_rate": 0.1}),
    ("OneCycle", {"cycle_min_lr": 0.001, "cycle_max_lr": 0.05, "cycle_first_step_size": 5,
                  "cycle_first_stair_count": 2}),
    ("LRRangeTest", {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 2.0}),
    ("LRRangeTest", {"lr_range_test_min_lr": 0.002, "lr_range_test_step_size": 4, "lr_range_test_staircase": True}),
]
STEPS = 14
BASE_LR = 0.05


def sequence(make) -> list[float]:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)  # betas: OneCycle cycles them
    sched = make(opt)
    out = []
    for _ in range(STEPS):
        group = opt.param_groups[0]
        out.append((float(group["lr"]), *map(float, group["betas"])))  # what this optimizer step uses
        sched.step()
    return out


def main() -> int:
    bad = 0
    for name, params in CASES:
        ds = sequence(lambda opt, n=name, p=params: getattr(lr_schedules, n)(opt, **p))
        zr = sequence(lambda opt, n=name, p=params: build_scheduler(n, dict(p), opt))
        diff = [i for i, (a, b) in enumerate(zip(ds, zr, strict=True))
                if max(abs(x - y) for x, y in zip(a, b, strict=True)) > 1e-12]
        bad += bool(diff)
        print(json.dumps({"schedule": name, "params": params, "deepspeed": [[round(x, 12) for x in row] for row in ds],
                          "first_mismatch": diff[0] if diff else None}))
    print("all match" if not bad else f"{bad} case(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
