"""Read a ``torch.distributed.checkpoint`` (DCP) directory as data: its ``.metadata`` and its tensor chunks.

FSDP2 and torchtitan save this format: ``DIR/.metadata`` (a pickled ``Metadata``: per
state-dict key the tensor's size, dtype and the chunks - offsets and sizes - that some
rank wrote, and for each chunk the file, byte offset and length) and ``__R_N.distcp``
files holding each chunk as a ``torch.save`` record.

torch's own reader loads ``.metadata`` with plain ``pickle.load``, which runs whatever a
file names. Here it is unpickled by :class:`MetadataUnpickler`, which resolves only DCP's
own metadata classes, ``torch.Size``, torch dtypes and layouts, and ``pathlib`` paths; any
other global is refused (``trust=True``, a file the user vouches for, lifts that). Each chunk
loads with ``torch.load(weights_only=True)``, and a chunk's file must be a plain name in
``DIR``. Nothing here imports the engine.
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.safe_load import TRUST_HINT

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

METADATA = ".metadata"


class StorageInfo(Protocol):
    """Where one chunk's bytes are (DCP's own storage record, as its metadata unpickles it)."""

    relative_path: str
    offset: int
    length: int

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                              "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


def is_dcp(path: Path) -> bool:
    """A DCP checkpoint directory: it holds ``.metadata``."""
    return (path / METADATA).is_file()


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata classes and plain data only (a named class's own ``__setstate__`` runs)."""

    def find_class(self, module: str, name: str) -> type | object:
        if name in _ALLOWED.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                 torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not DCP metadata")


def read_metadata(path: Path, trust: bool = False) -> Metadata:
    """``path/.metadata`` as DCP's ``Metadata``, refusing any global outside :data:`_ALLOWED` unless ``trust``."""
    file = path / METADATA
    try:
        with file.open("rb") as f:
            return pickle.load(f) if trust else MetadataUnpickler(f).load()  # trust: the user vouched for it
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{file}: refused to load this DCP metadata: {e}, code that unpickling would run; "
                              "a checkpoint loads as data only", TRUST_HINT) from None
    except (OSError, EOFError, AttributeError, ValueError) as e:
        raise CheckpointError(f"{file}: unreadable DCP metadata ({e})",
                              "the checkpoint is damaged or written by an unsupported torch") from e


@dataclass(frozen=True)
class Chunk:
    """One saved piece of a tensor: ``sizes`` at ``offsets``; where it is on disk."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    byte_offset: int
    length: int

    def flat_range(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """(start, numel) in the tensor's row-major flat layout, or None where the chunk is not one run
        (it is cut along a dimension other than the first)."""
        if any(o != 0 or s != full for o, s, full in zip(self.offsets[1:], self.sizes[1:], shape[1:], strict=True)):
            return None
        row = math.prod(shape[1:])
        return (self.offsets[0] * row if shape else 0), math.prod(self.sizes)


@dataclass(frozen=True)
class Entry:
    """One tensor of the saved state dict."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[Chunk, ...]


class DcpReader:
    """The tensors of a DCP directory, read chunk by chunk (each chunk at most once)."""

    def __init__(self, path: Path, trust: bool = False) -> None:
        self.path, self.trust = path, trust
        meta = read_metadata(path, trust)
        storage = {(key.fqn, tuple(key.offset or ())): info for key, info in meta.storage_data.items()}
        entries: dict[str, Entry] = {}
        for name, md in meta.state_dict_metadata.items():
            if not hasattr(md, "chunks"):  # BytesStorageMetadata: a pickled non-tensor value, not read
                continue
            chunks = []
            for index, c in enumerate(md.chunks):
                info = _storage_info(storage, name, tuple(c.offsets), index)
                if getattr(info, "transform_descriptors", None):
                    raise CheckpointError(f"{path}: {name} is stored with transforms {info.transform_descriptors}",
                                          "load it with torch.distributed.checkpoint and save it without extensions")
                chunks.append(Chunk(tuple(c.offsets), tuple(c.sizes), _plain_name(path, info.relative_path),
                                    int(info.offset), int(info.length)))
            entries[name] = Entry(name, tuple(md.size), md.properties.dtype, tuple(chunks))
        self.entries = entries

    def read_chunk(self, chunk: Chunk) -> torch.Tensor:
        """One chunk: one ``torch.save`` record, read whole (its bytes only)."""
        return _load_chunk(self.path / chunk.file, chunk.byte_offset, chunk.length)

    def read_whole(self, name: str) -> torch.Tensor:
        """The whole tensor ``name`` (assembled from its chunks)."""
        entry = self.entries[name]
        if len(entry.chunks) == 1 and tuple(entry.chunks[0].sizes) == entry.shape:
            return self.read_chunk(entry.chunks[0]).reshape(entry.shape)
        out = torch.empty(entry.shape, dtype=entry.dtype, device="cpu")
        for c in entry.chunks:
            view = out
            for dim, (o, s) in enumerate(zip(c.offsets, c.sizes, strict=True)):
                view = view.narrow(dim, o, s)
            view.copy_(self.read_chunk(c).reshape(c.sizes))
        return out


def _storage_info(storage: dict[tuple[str, tuple[int, ...]], StorageInfo], name: str, offsets: tuple[int, ...],
                  index: int) -> StorageInfo:
    info = storage.get((name, offsets))  # MetadataIndex(fqn, offset, index): the index is only a hint
    if info is not None:
        return info
    raise CheckpointError(f"DCP metadata names no storage for {name} at {list(offsets)} (chunk {index})",
                          "the checkpoint is damaged")


def _plain_name(path: Path, name: str) -> str:
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise CheckpointError(f"{path / METADATA}: chunk file {name!r} is not a file name inside {path}",
                              "a DCP checkpoint's chunk files live in its own directory")
    return name


def _load_chunk(file: Path, offset: int, length: int) -> torch.Tensor:
    with file.open("rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise CheckpointError(f"{file}: {length} bytes expected at offset {offset}, {len(data)} found",
                              "the checkpoint is incomplete or damaged")
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
