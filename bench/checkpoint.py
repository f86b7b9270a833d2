"""Checkpoint save/load time and size against ``torch.save`` of the full state (toy MLP, one process).

    python bench/checkpoint.py [--hidden 512 --layers 8 --stage 2]

The baseline writes ``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}``
with one ``torch.save`` (no fsync, no rename) and reads it back with ``torch.load``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from offload import toy  # bench/offload.py, beside this file


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    import zerorun

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--stage", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 16, "steps_per_print": 10**6,
           "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 2**22},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    engine, optimizer, _, _ = zerorun.initialize(model=toy(args.hidden, args.layers), config=cfg)
    x = torch.randn(16, args.hidden, device="cpu")
    engine.backward(engine(x).square().mean())
    engine.step()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        engine.save_checkpoint(str(root / "zr"))
        t_save = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine.load_checkpoint(str(root / "zr"))
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch.save({"model": engine.module.state_dict(), "optimizer": optimizer.state_dict()}, root / "full.pt")
        b_save = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch.load(root / "full.pt", weights_only=False)
        b_load = time.perf_counter() - t0
        zr_size, full_size = _size(root / "zr"), (root / "full.pt").stat().st_size
    print(f"{engine.num_parameters():,} params, stage {args.stage}, 1 rank")
    print(f"zerorun save_checkpoint: {t_save * 1000:.0f} ms, load_checkpoint: {t_load * 1000:.0f} ms, "
          f"{zr_size / 2**20:.1f} MiB")
    print(f"torch.save full state:   {b_save * 1000:.0f} ms, torch.load:      {b_load * 1000:.0f} ms, "
          f"{full_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
