"""Peak memory of ``zerorun convert --to hf`` against the checkpoint's size (one process per conversion).

    python bench/convert_memory.py make CKPT --params 8e6 [--width 512]   # a world-1 checkpoint, fp32 masters
    python bench/convert_memory.py convert CKPT OUT --max_shard_size 3MB [--dtype bf16]

``convert`` prints one JSON line: the checkpoint's fp32 bytes, the shard limit, the largest
tensor, and ``peak_over_start``: the process's ``VmHWM`` during the conversion minus its
``VmRSS`` just before (the peak is reset first through ``/proc/self/clear_refs``), so
Python's and torch's own resident set is not counted.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch


def make(ckpt: Path, params: float, width: int) -> None:
    import zerorun

    layers = max(1, round(params / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 0}}
    engine, _, _, _ = zerorun.initialize(model=model, config=cfg)
    engine.save_checkpoint(str(ckpt), tag="t")  # no step: the rank file holds the fp32 masters only
    print(json.dumps({"params": engine.num_parameters(), "layers": layers}))


def convert(ckpt: Path, out: Path, max_shard_size: str, dtype: str) -> dict[str, object]:
    from zerorun.engine import physical_memory
    from zerorun.engine.checkpoint.convert_to import convert_to, parse_size
    from zerorun.engine.checkpoint.manifest import MANIFEST, Manifest

    manifest = Manifest.from_json((ckpt / "t" / MANIFEST).read_text() if (ckpt / "t").is_dir()
                                  else (ckpt / MANIFEST).read_text())
    numels = [p.numel for b in manifest.buckets for p in b.params]
    if not physical_memory.reset_peak(torch.device("cpu")):
        raise SystemExit("no writable /proc/self/clear_refs: the peak cannot be measured from here")
    start = physical_memory.host_bytes("VmRSS") or 0
    files = convert_to(ckpt, out, "hf", None, dtype, False, max_shard_size)
    peak = physical_memory.host_bytes("VmHWM") or 0
    size = {"fp32": 4, "bf16": 2, "fp16": 2}[dtype]
    return {"checkpoint_fp32_bytes": 4 * sum(numels), "max_shard_size": parse_size(max_shard_size),
            "largest_tensor_bytes": size * max(numels), "files": len(files), "dtype": dtype,
            "peak_over_start": peak - start, "peak_vmhwm": peak,
            "ratio_to_shard": round((peak - start) / parse_size(max_shard_size), 2),
            "checkpoint_over_shard": round(4 * sum(numels) / parse_size(max_shard_size), 1),
            "tensors": len(numels), "mean_tensor_bytes": math.floor(4 * sum(numels) / len(numels))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make")
    m.add_argument("ckpt", type=Path)
    m.add_argument("--params", type=float, default=8e6)
    m.add_argument("--width", type=int, default=512)
    c = sub.add_parser("convert")
    c.add_argument("ckpt", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--max_shard_size", default="3MB")
    c.add_argument("--dtype", default="fp32")
    args = parser.parse_args()
    if args.what == "make":
        make(args.ckpt, args.params, args.width)
    else:
        print(json.dumps(convert(args.ckpt, args.out, args.max_shard_size, args.dtype)))


if __name__ == "__main__":
    main()
