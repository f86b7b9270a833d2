"""Checkpoint save/load time and size against ``torch.save`` of the full state (toy MLP, one process).

    python bench/checkpoint.py [--hidden 512 --layers 8 --stage 2]
    python bench/checkpoint.py --decoupled [--hidden 512 --layers 12 --saves 4 --world 2]

``--decoupled``: ``--world`` gloo ranks each train two engines built alike, one saving
synchronously and one with ``checkpoint.writer.decoupled``, interleaved round by round: per
round each engine trains a step, saves (the time the call blocks), trains ``--after`` steps
(the decoupled one's while its writer writes), and then the decoupled writer's remaining
write is waited for (reported, not counted as blocking) so that the next synchronous save
never shares the disk with it. At the end each engine's last tag is loaded into a fresh
engine and compared bit for bit with the live masters and optimizer state.

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
    parser.add_argument("--decoupled", action="store_true", help="sync vs decoupled saves at --world ranks")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--after", type=int, default=2, help="steps after each save")
    args = parser.parse_args()
    if args.decoupled:
        from checkpoint_decoupled import compare  # bench/checkpoint_decoupled.py, beside this file

        compare(args.hidden, args.layers, args.stage, args.world, args.saves, args.after)
        return
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
