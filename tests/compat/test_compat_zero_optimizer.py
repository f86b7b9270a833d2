"""``engine.optimizer.needs_scaler()`` and ``isinstance(engine.optimizer, ZeROOptimizer)`` under ``import
deepspeed`` (zerorun.engine.surface.zero_optimizer, zerorun.compat.base_optimizer), as DeepSpeed 0.19.8's
manual-backward scripts read them; and its refusal of an unscaled plain backward under fp16's dynamic scale.

One process, ``import deepspeed`` answered by zerorun (a subprocess: the shim is installed at interpreter start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, os, torch
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
import deepspeed
from deepspeed.runtime.base_optimizer import ZeROOptimizer, DeepSpeedOptimizer
from deepspeed.utils.torch import required_torch_version

def engine(stage, precision):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, **precision}
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]

out = {}
for name, stage, precision in [("z0-fp32", 0, {}), ("z1-fp16", 1, {"fp16": {"enabled": True}}),
                               ("z3-bf16", 3, {"bf16": {"enabled": True}}),
                               ("z2-static", 2, {"fp16": {"enabled": True, "loss_scale": 128}})]:
    e = engine(stage, precision)
    out[name] = [isinstance(e.optimizer, ZeROOptimizer), isinstance(e.optimizer, DeepSpeedOptimizer),
                 e.optimizer.needs_scaler()]
    if name == "z1-fp16":
        x = torch.randn(2, 4, dtype=torch.float16)
        try:
            e(x).float().sum().backward()
            out["unscaled"] = "no error"
        except RuntimeError as err:
            out["unscaled"] = str(err)
        e.scale(e(x).float().sum()).backward()  # scaled: accepted, and the step takes it
        e.step()
        out["scaled_steps"] = e.global_steps
    e.destroy()
out["torch_version"] = required_torch_version(min_version=1.4)
out["plain_optimizer"] = isinstance(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1), ZeROOptimizer)
print(json.dumps(out))
"""


def test_needs_scaler_and_zero_optimizer_answer_as_deepspeeds() -> None:
    env = {**os.environ, "ZERORUN_AS_DEEPSPEED": "force", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["z0-fp32"] == [False, False, False]  # stage 0 has no ZeRO optimizer
    assert got["z1-fp16"] == [True, True, True]  # fp16's dynamic scale needs engine.scale
    assert got["z3-bf16"] == [True, True, False]
    assert got["z2-static"] == [True, True, False]  # DeepSpeed's rule: only a dynamic scale says True
    assert got["unscaled"].startswith("[rank 0] Loss scaling is required for this configuration"), got["unscaled"]
    assert got["scaled_steps"] == 1
    assert got["plain_optimizer"] is False
    assert got["torch_version"] is True  # deepspeed.utils.torch imports under the shim
