"""``engine.save_checkpoint``: every rank writes its chunks, rank 0 commits the tag.

Order (each file written to a temporary name, fsynced and renamed):

1. every rank writes ``rank_NNNNN.pt`` into the staging directory ``save_dir/.TAG.saving``;
2. the ranks agree that every rank file is durable (one all-reduce, which also
   carries failures: a rank that could not write makes every rank raise);
3. rank 0 writes ``manifest.json`` into the staging directory, renames it to
   ``save_dir/TAG`` (an older ``TAG`` is first moved aside to ``.TAG.old``), and
   finally rewrites ``latest``.

A crash before step 3 leaves only a staging directory, which no loader reads; ``latest``
still names the previous complete tag. A save that fails (a full disk) removes its staging
directory, and the next save sweeps any that a crash left. ``client_state`` goes in a file
of its own per rank (``client_state_NNNNN.pt``): it holds whatever the script passed, so
it is the one file whose loading may need ``trust_checkpoint``. The checkpoint directory must be on a file
system every rank sees (one directory per node is not a checkpoint).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerorun import __version__
from zerorun.engine.checkpoint import atomic, layout, state, zero_to_fp32
from zerorun.engine.checkpoint.errors import CheckpointArgumentError, CheckpointError
from zerorun.engine.checkpoint.manifest import EXTRA, LATEST, MANIFEST, Manifest, client_file, rank_file
from zerorun.engine.checkpoint.tag_check import agreed_tag
from zerorun.engine.mechanism.gathered import gathered_frozen
from zerorun.engine.offload.resident import resident

if TYPE_CHECKING:
    from zerorun.engine.views import CheckpointView, Placement, Shards

PAUSE_ENV = "ZERORUN_TEST_CHECKPOINT_PAUSE_S"  # test hook: sleep after this rank's file is durable


def staging_dir(root: Path, tag: str) -> Path:
    return root / f".{tag}.saving"


def previous_dir(root: Path, tag: str) -> Path:
    return root / f".{tag}.old"


def check_tag(tag: str) -> str:
    if not tag or "/" in tag or tag.startswith(".") or tag == LATEST:
        raise CheckpointError(f"checkpoint tag {tag!r} is not a plain directory name",
                              "use a tag like 'global_step100' (no '/', not starting with '.', not 'latest')")
    return tag


def agree(engine: Placement, error: BaseException | None, what: str) -> None:
    """All ranks learn whether every rank succeeded at ``what``; raise on all of them if not.

    Every failure of a step is caught and carried by this one all-reduce, so a rank that
    fails never leaves the others waiting in the next collective.
    """
    if engine.coll.all_true(error is None):  # a flag on the group's device (NCCL takes no CPU tensor)
        return
    hint = "check that the directory is writable and has free space on every node; " \
           "the previous checkpoint and `latest` are untouched"
    if error is not None:
        raise CheckpointError(f"[rank {engine.ctx.rank}] checkpoint save failed while {what}: {error}", hint) from error
    raise CheckpointError(f"[rank {engine.ctx.rank}] checkpoint save failed while {what} on another rank "
                          "(its error names the cause)", hint)


def _attempt(fn: Callable[[], None]) -> BaseException | None:
    try:
        fn()
    except Exception as e:  # carried to every rank by ``agree``
        return e
    return None


def host_clone(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().clone()


def rank_payload(engine: CheckpointView, host_copy: Callable[[torch.Tensor], torch.Tensor] = host_clone) -> dict[str, Any]:
    """This rank's chunk of every bucket's fp32 master and optimizer state, plus the small state.

    ``host_copy`` makes each chunk's host copy (a decoupled save copies into reused buffers)."""
    parts = engine.parts
    world, rank, _ = layout.saved_world(engine)
    owned = layout.owned_parts(engine)
    buckets = []
    with resident(parts.masters):
        for b, m in zip(parts.buckets, parts.masters.masters, strict=True):
            padded = b.plan.padded_numel
            chunk = layout.chunk_of(m.detach(), padded, owned, world, rank)
            opt_state: dict[str, Any] = {}
            for k, v in engine.optimizer.state.get(m, {}).items():
                is_chunk = torch.is_tensor(v) and v.numel() == m.numel() and v.numel() > 1
                opt_state[k] = (host_copy(layout.chunk_of(v, padded, owned, world, rank)) if is_chunk
                                else (v.cpu().clone() if torch.is_tensor(v) else v))
            buckets.append({"master": host_copy(chunk.float()), "state": opt_state})
    return {"rank": rank, "buckets": buckets, "engine": state.capture(engine)}


def write_extra(engine: Shards, staging: Path, exclude_frozen: bool = False) -> None:
    """Rank 0: the module's buffers and frozen parameters (replicated, so written once; the frozen ones
    left out with ``exclude_frozen``)."""
    entries, aliases = layout.engine_layout(engine)
    stored = {p.name for b in entries for p in b.params}
    atomic.torch_save(layout.extra_state(engine.module, stored, aliases, exclude_frozen), staging / EXTRA)


def write_recovery_script(root: Path) -> None:
    """``root/zero_to_fp32.py``, as DeepSpeed writes its own: ``python zero_to_fp32.py . out_dir`` needs only torch."""
    script = root / zero_to_fp32.SCRIPT_NAME
    atomic.write_bytes(script, Path(zero_to_fp32.__file__).read_bytes())
    make_executable(script)


def make_executable(script: Path) -> bool:
    """Set the execute bits of ``script``; where the file system refuses (an Azure file share allows no
    chmod) or the file is gone, say so at INFO on DeepSpeed's logger, as DeepSpeed does, and go on: the
    script still runs as ``python zero_to_fp32.py``. True when the bits were set."""
    try:
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except (FileNotFoundError, PermissionError) as e:
        logging.getLogger("DeepSpeed").info(f"Warning: Could not change permissions for {script} due to error: {e}. "
                                            "Continuing without changing permissions.")
        return False
    return True


def build_manifest(engine: CheckpointView, exclude_frozen: bool = False) -> Manifest:
    """The manifest of a checkpoint of ``engine`` as it is now (pure data); ``frozen`` names the frozen
    parameters extra.pt holds (none with ``exclude_frozen``)."""
    entries, aliases = layout.engine_layout(engine)
    stored = {p.name for b in entries for p in b.params}
    frozen = [] if exclude_frozen else layout.frozen_names(engine.module, stored)
    return Manifest(world_size=layout.saved_world(engine)[0], stage=engine.zero_stage, dtype=engine.precision.name,
                    zerorun_version=__version__, buckets=entries, global_steps=engine.global_steps,
                    aliases=aliases, optimizer=type(engine.optimizer).__name__, frozen=frozen)


def _commit(engine: CheckpointView, root: Path, tag: str, save_latest: bool, exclude_frozen: bool) -> None:
    commit_staged(root, tag, build_manifest(engine, exclude_frozen), save_latest)


def commit_staged(root: Path, tag: str, manifest: Manifest, save_latest: bool) -> None:
    """Rank 0: manifest into the staging directory, staging -> TAG, then ``latest``."""
    staging, final, old = staging_dir(root, tag), root / tag, previous_dir(root, tag)
    atomic.write_text(staging / MANIFEST, manifest.to_json())
    write_recovery_script(root)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        atomic.rename_dir(final, old)
    atomic.rename_dir(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    if save_latest:
        atomic.write_text(root / LATEST, tag)


def checked_save_dir(save_dir: str | os.PathLike[str]) -> Path:
    if not save_dir:
        raise CheckpointArgumentError(f"save_dir must be a non-empty string, got {save_dir!r}",
                                      "pass the directory that holds the checkpoints, e.g. 'checkpoints'")
    return Path(save_dir)


def save_checkpoint(engine: CheckpointView, save_dir: str | os.PathLike[str], tag: str | None = None,
                    client_state: dict[str, Any] | None = None, save_latest: bool = True,
                    exclude_frozen: bool = False) -> Path:
    """Save a complete checkpoint as ``save_dir/tag`` (default tag ``global_step<N>``), written before it
    returns; all ranks call it (``checkpoint.saving`` picks this or the decoupled writer). With
    ``exclude_frozen`` the frozen parameters are left out (a load keeps the module's own)."""
    root = checked_save_dir(save_dir)
    rank = engine.ctx.rank
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    tag = check_tag(agreed_tag(engine.coll, rank, tag, engine.config.checkpoint.tag_validation))
    staging = staging_dir(root, tag)

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            sweep_staging(root)  # left by an earlier crash or a full disk: each holds a checkpoint's bytes
            staging.mkdir()

    _, saved_rank, writes = layout.saved_world(engine)

    def write() -> None:
        if writes:  # MiCS: one replica of each shard
            atomic.torch_save(rank_payload(engine), staging / rank_file(saved_rank))
        atomic.torch_save(dict(client_state or {}), staging / client_file(rank))
        if rank == 0:
            write_extra(engine, staging, exclude_frozen)

    try:
        agree(engine, _attempt(prepare), f"creating {staging}")
        with gathered_frozen(engine.parts.frozen):  # stage 3: frozen parameters are shards; extra.pt holds them whole
            error = _attempt(write)
        if os.environ.get(PAUSE_ENV):
            time.sleep(float(os.environ[PAUSE_ENV]))
        agree(engine, error, f"writing {staging / rank_file(rank)}")
        agree(engine, _attempt(lambda: _commit(engine, root, tag, save_latest, exclude_frozen)) if rank == 0 else None,
              f"committing {root / tag}")
    except CheckpointError:
        if rank == 0:  # every rank is past its writes (``agree`` is a collective): the half-written tag goes
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return root / tag


def sweep_staging(root: Path, keep: frozenset[Path] = frozenset()) -> list[Path]:
    """Remove every ``.TAG.saving`` folder under ``root`` (rank 0, before a save): a staging folder outlives
    only a save that crashed or failed, and a full disk stays full while it is there. ``keep``: the ones a
    background writer is still filling."""
    swept = [d for d in root.glob(".*.saving") if d.is_dir() and not d.is_symlink() and d not in keep]
    for d in swept:
        shutil.rmtree(d, ignore_errors=True)
    return swept
