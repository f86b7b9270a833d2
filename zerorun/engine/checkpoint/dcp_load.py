"""``load_checkpoint`` of a ``torch.distributed.checkpoint`` directory: module weights at any world and stage.

Each rank cuts its owned ranges into pieces (``reshard.chunk_pieces``: runs of one
parameter's flat elements), finds the DCP chunks of that parameter that overlap them and
reads only those chunks (a chunk cut along its first dimension, as FSDP2 and a plain
model's single chunk are, is one run of flat elements; a chunk cut along another
dimension makes the whole parameter be assembled once). The fp32 masters take the values
(cast from the saved dtype) and are published into the compute parameters, as a zerorun
load does. Buffers and frozen parameters are read whole. Keys may sit under ``model.``
(``dcp.save({"model": sd})``, torchtitan) or ``module.``; other keys (``optim.*``) are not
read. The optimizer state, counters and scheduler are not loaded from DCP: ask for
``load_module_only=True`` (anything else warns and loads the weights only).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.checkpoint import layout, reshard
from zerorun.engine.checkpoint.dcp_format import Chunk, DcpReader
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.mechanism.gathered import gathered_frozen
from zerorun.engine.offload.resident import resident

if TYPE_CHECKING:
    from zerorun.engine.views import CheckpointView

PREFIXES = ("", "model.", "module.", "_orig_mod.")


def key_prefix(saved: set[str], wanted: set[str]) -> str:
    """The prefix under which the most of ``wanted`` are in ``saved`` (all of them, where one has them all)."""
    return max(PREFIXES, key=lambda p: sum(f"{p}{n}" in saved for n in wanted))


class _Pieces:
    """Copies saved chunks into flat element runs of one parameter, reading each chunk once."""

    def __init__(self, reader: DcpReader) -> None:
        self.reader = reader
        self._name: str | None = None
        self._cache: dict[Chunk, torch.Tensor] = {}

    def _chunk(self, key: str, chunk: Chunk) -> torch.Tensor:
        if self._name != key:  # pieces come parameter by parameter: only one parameter's chunks are held
            self._name, self._cache = key, {}
        if chunk not in self._cache:
            self._cache[chunk] = self.reader.read_chunk(chunk).reshape(-1)
        return self._cache[chunk]

    def fill(self, key: str, start: int, length: int, out: torch.Tensor) -> None:
        """``out`` (``length`` elements) = flat elements ``start..start+length`` of the saved tensor ``key``."""
        entry = self.reader.entries[key]
        runs = [(c, c.flat_range(entry.shape)) for c in entry.chunks]
        if any(r is None for _, r in runs):  # cut along another dimension: assemble the parameter once
            whole = Chunk((0,) * len(entry.shape), entry.shape, "", -1, -1)
            if self._name != key or whole not in self._cache:
                self._name, self._cache = key, {whole: self.reader.read_whole(key).reshape(-1)}
            out.copy_(self._cache[whole].narrow(0, start, length))
            return
        for chunk, run in runs:
            assert run is not None
            a, b = max(start, run[0]), min(start + length, run[0] + run[1])
            if a < b:
                out.narrow(0, a - start, b - a).copy_(self._chunk(key, chunk).narrow(0, a - run[0], b - a))


def load_dcp(engine: CheckpointView, path: Path, load_module_only: bool, strict: bool, trust: bool
             ) -> tuple[str, dict[str, Any]]:
    """Fill the engine's weights from the DCP directory ``path``; returns ``(path, {})`` (DCP has no
    client state)."""
    if not load_module_only:
        warnings.warn(f"{path} is a torch.distributed.checkpoint directory: only the module weights load "
                      "(not the optimizer state, step counters or scheduler); pass load_module_only=True",
                      stacklevel=3)
    reader = DcpReader(path, trust)
    current, aliases = layout.engine_layout(engine)
    params = {p.name: p.shape for b in current for p in b.params}
    module_keys = [k for k in engine.module.state_dict() if k not in aliases]
    prefix = key_prefix(set(reader.entries), set(module_keys))
    saved = {n[len(prefix):]: e.shape for n, e in reader.entries.items() if n.startswith(prefix)}
    _check(path, prefix, saved, params, strict)
    pieces = _Pieces(reader)
    masters = engine.parts.masters.masters
    parts, index = layout.owned_parts(engine)
    with resident(engine.parts.masters), torch.no_grad():
        for piece in reshard.chunk_pieces(current, parts, index):
            if piece.name in saved:
                out = masters[piece.bucket].data.view(-1).narrow(0, piece.pos, piece.length)
                pieces.fill(prefix + piece.name, piece.start, piece.length, out)
        layout.publish_masters(engine)
    extra = {k: reader.read_whole(prefix + k) for k in module_keys if k not in params and k in saved}
    if extra:
        with gathered_frozen(engine.parts.frozen, modifier_rank=0):  # stage 3: every rank keeps its chunk
            engine.module.load_state_dict(extra, strict=False)
    engine.parts.grad_sync.zero()
    return str(path), {}


def _check(path: Path, prefix: str, saved: dict[str, tuple[int, ...]], params: dict[str, tuple[int, ...]],
           strict: bool) -> None:
    """Shapes of the parameters both have must agree; with ``strict`` every parameter must be saved."""
    diffs = [f"{n}: checkpoint shape {list(saved[n])}, model shape {list(s)}" for n, s in params.items()
             if n in saved and tuple(saved[n]) != tuple(s)]
    if strict:
        diffs += [f"{n} {list(s)} is in the model but not in the checkpoint" for n, s in params.items()
                  if n not in saved]
    if diffs:
        where = f" (keys under {prefix!r})" if prefix else ""
        more = [f"... and {len(diffs) - 5} more"] if len(diffs) > 5 else []
        raise CheckpointError(f"{path}{where} was saved from a different model: " + "; ".join(diffs[:5] + more),
                              "load it into the model it was saved from, or pass load_module_strict=False to "
                              "load the parameters both have")
