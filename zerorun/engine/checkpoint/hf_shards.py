"""Hugging Face safetensors shards from a checkpoint, streamed tensor by tensor (``zerorun convert --to hf``).

Writes ``model-0000k-of-0000n.safetensors`` plus ``model.safetensors.index.json`` (one
``model.safetensors`` when everything fits one shard), the layout ``from_pretrained`` reads
beside a ``config.json``. The entries and their order are those of the single-file
``zerorun convert`` (every parameter, buffers, frozen parameters, tied names each as an entry).

Nothing holds the model: a safetensors file is a JSON header (every tensor's dtype, shape
and byte range) and then the raw bytes, and the manifest gives every shape before any
byte is read, so each shard's header is written first and each tensor is assembled
from the rank files' chunks, cast, written and dropped. The rank files are opened with
``torch.load(mmap=True, weights_only=True)`` (data only); the pages a tensor was read from
are dropped from the process once it is copied (``madvise``), and the files are re-opened
once ``max_shard_size`` bytes were read from them (where there is no ``madvise``), so the
pages a run has touched never add up to the model. Peak memory over the process's start:
at most one shard's worth of source pages, the largest tensor (its fp32 copy and its cast)
and a fixed few MB of first-use allocations, whatever the model's size (measured:
bench/convert_memory.py, BENCHMARKS.md; held under 3 shards by test_convert_memory.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import json
import math
import mmap
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from zerorun.atomic_file import write_with
from zerorun.engine.checkpoint import atomic, safe_load
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.manifest import EXTRA, MANIFEST, Manifest, rank_file

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}


@dataclass(frozen=True)
class Item:
    """One entry of the output: ``name``, its shape and dtype, and how to produce its tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype, device="cpu").element_size()


def plan_shards(items: list[Item], limit: int) -> list[list[Item]]:
    """Items per shard, in order; a shard stays under ``limit`` bytes unless one tensor alone is bigger."""
    shards: list[list[Item]] = [[]]
    size = 0
    for item in items:
        if shards[-1] and size + item.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item.nbytes
    return shards


def header(items: list[Item]) -> bytes:
    """The safetensors header of ``items`` (8-byte length, JSON, space-padded to 8 bytes)."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for item in items:
        if item.dtype not in ST_DTYPES:
            raise CheckpointError(f"{item.name}: dtype {item.dtype} has no safetensors name",
                                  "convert to .pt instead")
        meta[item.name] = {"dtype": ST_DTYPES[item.dtype], "shape": list(item.shape),
                           "data_offsets": [offset, offset + item.nbytes]}
        offset += item.nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(items: list[Item], path: Path) -> None:
    """Write ``items`` to ``path`` (atomically: a fresh temporary name, fsync, rename), one tensor at a time."""

    def write(f: BinaryIO) -> None:
        f.write(header(items))
        for item in items:
            t = item.make().to(item.dtype).contiguous()
            if tuple(t.shape) != item.shape:
                raise CheckpointError(f"{item.name}: made shape {list(t.shape)}, planned {list(item.shape)}",
                                      "the checkpoint is damaged")
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del t

    write_with(path, write)


class RankFiles:
    """The rank files of one tag, memory-mapped, re-opened after ``budget`` bytes were read from them."""

    def __init__(self, path: Path, world: int, trust: bool, budget: int) -> None:
        self.path, self.world, self.trust, self.budget = path, world, trust, budget
        self._files: dict[int, Any] | None = None
        self._read = 0

    def _open(self, rank: int) -> dict[str, object]:
        file = self.path / rank_file(rank)
        if self.trust:
            return torch.load(file, map_location="cpu", mmap=True, weights_only=False)
        with torch.serialization.safe_globals(list(safe_load.numpy_globals())):
            try:
                return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
            except Exception as e:  # the same refusal the other readers give
                raise safe_load.refused(file, e, "rank file") from None

    def chunk(self, rank: int, bucket: int) -> torch.Tensor:
        if self._files is None:
            self._files = {}
        if rank not in self._files:
            self._files[rank] = self._open(rank)["buckets"]
        return self._files[rank][bucket]["master"].reshape(-1)

    def read(self, nbytes: int) -> None:
        """Count bytes read; past the budget, drop the mappings (their pages leave the process)."""
        self._read += nbytes
        if self._read > self.budget:
            self._files, self._read = None, 0
            gc.collect()


_PAGE = mmap.PAGESIZE
_LIBC = None
with contextlib.suppress(OSError, TypeError):
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def drop_pages(t: torch.Tensor) -> None:
    """Drop the pages of the memory-mapped ``t`` from this process (``madvise(MADV_DONTNEED)``: clean,
    private, file-backed pages, re-read from the file if touched again); a no-op where libc has no madvise."""
    if _LIBC is None or not hasattr(_LIBC, "madvise") or t.numel() == 0:
        return
    lo = t.data_ptr() // _PAGE * _PAGE
    hi = -(-(t.data_ptr() + t.numel() * t.element_size()) // _PAGE) * _PAGE
    _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # 4: MADV_DONTNEED


def _param_maker(files: RankFiles, bucket: int, chunk_numel: int, offset: int, numel: int,
                 shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        out = torch.empty(numel, dtype=torch.float32, device="cpu")
        for r in range(offset // chunk_numel, (offset + numel - 1) // chunk_numel + 1 if numel else 0):
            lo, hi = max(offset, r * chunk_numel), min(offset + numel, (r + 1) * chunk_numel)
            src = files.chunk(r, bucket)
            piece = src.narrow(0, lo - r * chunk_numel, hi - lo)
            out.narrow(0, lo - offset, hi - lo).copy_(piece)
            drop_pages(piece)
            files.read((hi - lo) * src.element_size())
        return out.view(shape)

    return make


def zerorun_items(path: Path, dtype: torch.dtype, trust: bool, budget: int) -> list[Item]:
    """The items of a zerorun tag, in the single-file convert's order, each made on demand."""
    manifest = Manifest.from_json((path / MANIFEST).read_text())
    files = RankFiles(path, manifest.world_size, trust, budget)
    items: list[Item] = []
    for bi, bucket in enumerate(manifest.buckets):
        chunk = bucket.chunk_numel(manifest.world_size)
        items += [Item(p.name, tuple(p.shape), dtype, _param_maker(files, bi, chunk, p.offset, p.numel,
                                                                   tuple(p.shape))) for p in bucket.params]
    if (path / EXTRA).is_file():
        for name, value in safe_load.load(path / EXTRA, trust, what="extra file").items():
            out = dtype if value.is_floating_point() else value.dtype
            items.append(Item(name, tuple(value.shape), out, (lambda v=value: v)))
    by_name = {i.name: i for i in items}
    items += [Item(alias, by_name[name].shape, by_name[name].dtype, by_name[name].make)
              for alias, name in manifest.aliases.items() if name in by_name]
    return items


def state_items(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> list[Item]:
    """Items of an in-memory state dict (a DeepSpeed checkpoint, ``save_16bit_model``); ``dtype`` None keeps
    each tensor's own."""
    return [Item(k, tuple(v.shape), dtype if dtype is not None and v.is_floating_point() else v.dtype,
                 (lambda v=v: v)) for k, v in state.items()]


def shard_names(count: int) -> Iterator[str]:
    for k in range(1, count + 1):
        yield SINGLE if count == 1 else f"model-{k:05d}-of-{count:05d}.safetensors"


def write_hf(items: list[Item], out_dir: Path, max_shard_size: int, config: Path | None = None) -> list[Path]:
    """Write ``items`` as HF shards (and the index when there are several) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(items, max_shard_size)
    written, weight_map = [], {}
    for name, shard in zip(shard_names(len(shards)), shards, strict=True):
        write_safetensors(shard, out_dir / name)
        weight_map.update({i.name: name for i in shard})
        written.append(out_dir / name)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(i.nbytes for i in items)}, "weight_map": weight_map}
        atomic.write_text(out_dir / INDEX, json.dumps(index, indent=2) + "\n")
        written.append(out_dir / INDEX)
    if config is not None:
        atomic.write_bytes(out_dir / "config.json", Path(config).read_bytes())
        written.append(out_dir / "config.json")
    return written  # each file was fsynced and renamed by its own atomic write
