"""What DeepSpeed 0.19.8 keeps in which dtype with bf16 masters, measured on its CPU build, one process.

    DS_ACCELERATOR=cpu $DS_VENV/bin/python bench/ds_bf16_semantics.py [--json out.json]

Per ZeRO stage 1-3, with ``bf16.enabled`` + ``bf16_master_weights_and_grads`` + ``bf16_optimizer_states``
(and ``torch_autocast`` in bf16, as DeepSpeedExamples' ``bf16_full.json``), two micro-steps of
accumulation and clipping at 1.0: the module's parameter dtype, the optimizer's parameters (the
masters) and their moments, the gradient buffers the optimizer holds at the boundary, the global norm
and the optimizer class; which modules' outputs autocast leaves in fp32; what the masters alone (no
``bf16_optimizer_states``) and the autocast dtype spellings give. The docs (docs/bf16_masters.md) quote
its output. Not a test: it needs DeepSpeed.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from torch import nn

BOTH = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


def _dtypes(tensors: Any) -> list[str]:
    if isinstance(tensors, dict):
        tensors = list(tensors.values())
    out = set()
    for t in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
        if isinstance(t, (list, tuple, dict)):
            out.update(_dtypes(t))
        elif torch.is_tensor(t) and t.numel():
            out.add(str(t.dtype).replace("torch.", ""))
    return sorted(out)


def _optimizer_buffers(opt: Any) -> dict[str, list[str]]:
    """The gradient buffers a ZeRO optimizer holds (whichever of these its stage has)."""
    found = {}
    for name in ("averaged_gradients", "grad_partitions_flat_buffer", "single_partition_of_fp32_groups",
                 "fp32_partitioned_groups_flat"):
        value = getattr(opt, name, None)
        if value is None:
            continue
        found[name] = _dtypes(value)
        grads = [getattr(t, "grad", None) for t in (value if isinstance(value, list) else [])]
        if any(g is not None for g in grads):
            found[name + ".grad"] = _dtypes([g for g in grads if g is not None])
    return found


def probe_stage(deepspeed: Any, stage: int) -> dict[str, Any]:
    model = _model()
    outputs: dict[str, str] = {}

    def record(name: str, module: nn.Module, output: torch.Tensor) -> None:  # returns None: output unchanged
        outputs.setdefault(f"{name}:{type(module).__name__}", str(output.dtype).replace("torch.", ""))

    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(lambda m, i, o, n=name: record(n, m, o))
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
           "steps_per_print": 10**6, "bf16": BOTH, "torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    g = torch.Generator().manual_seed(1)
    boundary: dict[str, Any] = {}
    for micro in range(2):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        loss = nn.functional.mse_loss(engine(x.bfloat16()).float(), y)
        engine.backward(loss)
        if micro == 1:
            boundary = _optimizer_buffers(opt)
            boundary["module_param.grad"] = _dtypes([p.grad for p in model.parameters() if p.grad is not None])
        engine.step()
    inner = getattr(opt, "optimizer", opt)
    return {
        "stage": stage,
        "module_params": _dtypes(list(model.parameters())),
        "masters (optimizer params)": _dtypes([p for group in inner.param_groups for p in group["params"]]),
        "moments": _dtypes([v for s in inner.state.values() for k, v in s.items() if k != "step"]),
        "optimizer": type(inner).__name__,
        "at the boundary": boundary,
        "global_grad_norm": float(engine.get_global_grad_norm()),
        "global_grad_norm_type": type(engine.get_global_grad_norm()).__name__,
        "autocast outputs": outputs,
    }


def masters_alone(deepspeed: Any) -> str:
    """bf16 masters without bf16_optimizer_states and without offload: what DeepSpeed says."""
    model = _model()
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6,
           "bf16": {"enabled": True, "bf16_master_weights_and_grads": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 2}}
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    except Exception as e:  # noqa: BLE001 - the message is the measurement
        return f"{type(e).__name__}: {e}"
    return "accepted"


def spellings() -> dict[str, str]:
    from deepspeed.runtime.config import get_torch_autocast_dtype

    out = {}
    for s in ("bf16", "bfloat16", "torch.bfloat16", "BF16", "bfloat", "fp16", "float16", "half", "torch.float16",
              "fp32", "float", "float32"):
        try:
            out[s] = str(get_torch_autocast_dtype({"torch_autocast": {"dtype": s}}))
        except ValueError as e:
            out[s] = f"ValueError: {e}"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29633")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    result = {"deepspeed": deepspeed.__version__, "stages": [probe_stage(deepspeed, s) for s in (1, 2, 3)],
              "masters without bf16_optimizer_states, no offload": masters_alone(deepspeed),
              "torch_autocast.dtype spellings": spellings()}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
