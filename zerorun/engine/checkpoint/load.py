"""``engine.load_checkpoint``: validate the manifest against the model, then fill the owned ranges.

A DeepSpeed ZeRO tag directory loads the same way: ``ds_load`` presents it as a zerorun
checkpoint saved at world size 1 (the format is told by the files present). A
``torch.distributed.checkpoint`` directory (``.metadata``) loads its module weights through
``dcp_load``. A decoupled save still being written is waited for first (``decoupled.settle``).

Each rank computes (``reshard.plan_copies``) which saved chunks overlap its owned
ranges under the *current* world size and stage, reads only those rank files, copies the
pieces into its fp32 masters and optimizer state, then publishes the masters into the
compute parameters (an all-gather when sharded). The small state (counters, scaler,
scheduler, RNG) comes from saved rank ``rank mod N``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.checkpoint import (
    dcp_format,
    dcp_load,
    ds_files,
    ds_format,
    ds_load,
    layout,
    reshard,
    safe_load,
    state,
)
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.manifest import (
    EXTRA,
    LATEST,
    MANIFEST,
    Manifest,
    client_file,
    layout_differences,
    rank_file,
)
from zerorun.engine.checkpoint.resume_note import resume_line
from zerorun.engine.mechanism.gathered import gathered_frozen
from zerorun.engine.offload.resident import resident

if TYPE_CHECKING:
    from zerorun.engine.views import CheckpointView, Shards


def list_tags(root: Path) -> list[str]:
    """Complete tags under ``root`` (directories holding a manifest), oldest first."""
    if not root.is_dir():
        return []
    tags = [d for d in root.iterdir() if not d.name.startswith(".") and is_tag(d)]
    return [d.name for d in sorted(tags, key=lambda d: (d.stat().st_mtime, d.name))]


def is_tag(path: Path) -> bool:
    """A complete zerorun tag (it holds a manifest) or a DeepSpeed tag directory."""
    return (path / MANIFEST).is_file() or ds_files.is_deepspeed(path)


def tag_inside(root: Path, tag: str, source: str) -> Path:
    """``root/tag``, refused unless ``tag`` is one directory name that stays inside ``root``.

    ``latest`` is a file anyone with write access to the save directory can rewrite: its
    text is a name, never a path (``../elsewhere/t9`` would load a checkpoint from outside).
    """
    plain = tag not in ("", ".", "..") and not any(c in tag for c in "/\\\0")
    path = root / tag
    if plain and path.is_symlink():
        plain = path.resolve().parent == root.resolve()  # a tag linked to elsewhere leaves the save dir too
    if not plain:
        raise CheckpointError(f"{source}: checkpoint tag {tag!r} is not a directory name inside {root}",
                              f"a tag is one directory name in the save directory; pass the checkpoint's own "
                              f"save directory, or rewrite {root / LATEST} with a tag that is there")
    return path


def resolve(root: Path, tag: str | None) -> Path:
    """The directory of ``tag`` (``latest`` when None), inside ``root``; errors list the tags that exist."""
    tags = list_tags(root)
    listing = ", ".join(tags) if tags else "none"
    source = "tag="
    if tag is None:
        latest = root / LATEST
        if not latest.is_file():
            raise CheckpointError(f"{root}: no '{LATEST}' file, so no tag to load (complete tags: {listing})",
                                  "pass tag= explicitly, or save_checkpoint() into this directory first")
        tag, source = latest.read_text().strip(), str(latest)
    path = tag_inside(root, str(tag), source)
    if is_tag(path):
        return path
    moved = root / f".{tag}.old"  # a re-save of this tag was interrupted between its two renames
    if (moved / MANIFEST).is_file():
        return moved
    raise CheckpointError(f"{root}: checkpoint tag {tag!r} does not exist or is incomplete "
                          f"(complete tags: {listing})", "pass one of the listed tags")


def read_manifest(path: Path) -> Manifest:
    try:
        return Manifest.from_json((path / MANIFEST).read_text())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path / MANIFEST}: unreadable manifest ({e})",
                              "the checkpoint is damaged; load an earlier tag") from e


def read_rank(path: Path, rank: int, trust: bool = False) -> dict[str, Any]:
    """Rank ``rank``'s file as data (``safe_load``); any pickled global only with ``trust``."""
    file = path / rank_file(rank)
    try:
        return safe_load.load(file, trust, what="rank file")
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"{file}: cannot read the rank file ({e})",
                              "the checkpoint is incomplete or damaged; load an earlier tag") from e


def read_client_state(path: Path, rank: int, rank_files: dict[int, dict[str, Any]], trust: bool) -> dict[str, Any]:
    """The ``client_state`` rank ``rank`` saved: its own file (the one step that may need ``trust``: it holds
    whatever the script passed), or the rank file's key in checkpoints written before it had one."""
    file = path / client_file(rank)
    if not file.is_file():
        return rank_files[rank].get("client_state", {})
    try:
        return safe_load.load(file, trust, what="client_state file")
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"{file}: cannot read the client_state file ({e})",
                              "the checkpoint is incomplete or damaged; load an earlier tag") from e


def check_model(manifest: Manifest, path: Path, current: tuple[Any, ...], strict: bool = True) -> None:
    """Names and shapes must match; with ``strict=False`` only the shapes of shared names must."""
    model = {p.name: p.shape for b in current for p in b.params}
    saved = manifest.shapes()
    if not strict:
        saved = {n: s for n, s in saved.items() if n in model}
        model = {n: s for n, s in model.items() if n in saved}
    diffs = layout_differences(saved, model)
    if diffs:
        raise CheckpointError(f"{path} was saved from a different model: " + "; ".join(diffs),
                              "load it into the model it was saved from (same parameter names and shapes), "
                              "or convert it with `zerorun convert` and load the tensors you need")


def group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, Any]:
    return next((g for g in optimizer.param_groups if any(p is param for p in g["params"])), {})


def scalar_state_device(group: dict[str, Any], param_device: torch.device) -> torch.device:
    """Where torch.optim keeps a scalar state (Adam's ``step``): on the parameter's device for
    fused or capturable optimizers, on the CPU otherwise (the saved files are read to the CPU)."""
    return param_device if group.get("fused") or group.get("capturable") else torch.device("cpu")


def _fill(engine: Shards, copies: list[reshard.Copy], files: dict[int, dict[str, Any]],
          optimizer_states: bool) -> None:
    masters = engine.parts.masters.masters
    if optimizer_states:
        for m in masters:
            engine.optimizer.state.pop(m, None)
    with torch.no_grad():
        for c in copies:
            src = files[c.src_rank]["buckets"][c.src_bucket]
            dst = masters[c.dst_bucket]
            dst.data.view(-1).narrow(0, c.dst_pos, c.length).copy_(src["master"].narrow(0, c.src_pos, c.length))
            if not optimizer_states:
                continue
            st = engine.optimizer.state.setdefault(dst, {})
            for k, v in src["state"].items():
                if torch.is_tensor(v) and v.dim() == 1 and v.numel() == src["master"].numel() and v.numel() > 1:
                    if k not in st:
                        st[k] = torch.zeros_like(dst.data, dtype=v.dtype)
                    st[k].view(-1).narrow(0, c.dst_pos, c.length).copy_(v.narrow(0, c.src_pos, c.length))
                elif k not in st:
                    st[k] = v.to(scalar_state_device(group_of(engine.optimizer, dst), dst.device), copy=True) \
                        if torch.is_tensor(v) else v


def nothing_to_resume(root: Path) -> tuple[None, None]:
    """DeepSpeed's answer to loading ``latest`` where there is none: warn, load nothing."""
    tags = list_tags(root) if root.is_dir() else []
    warnings.warn(f"load_checkpoint: no '{LATEST}' file in {root}, nothing loaded (complete tags: "
                  f"{', '.join(tags) or 'none'}); pass tag= to load one", stacklevel=3)
    return None, None


def load_checkpoint(engine: CheckpointView, load_dir: str | os.PathLike[str], tag: str | None = None,
                    load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                    load_module_only: bool = False, strict: bool = True,
                    load_rng_state: bool = False, trust_checkpoint: bool = False
                    ) -> tuple[str, dict[str, Any]] | tuple[None, None]:
    """Load ``load_dir/tag`` at any world size and stage; returns ``(path, client_state)``.

    Without ``tag`` and without a ``latest`` file there is nothing to resume: a warning and
    ``(None, None)``, as DeepSpeed returns (scripts call it unconditionally on a first start).

    ``strict=False`` (DeepSpeed's ``load_module_strict``) skips parameters missing on either side.
    The global RNG states saved with the checkpoint are restored only with ``load_rng_state``
    (DeepSpeed never restores them, so by default the script's own seeding stands).
    Every file loads as data only; ``trust_checkpoint=True`` lets files the user vouches for
    name any global (a ``client_state`` holding the script's own classes needs it).
    """
    from zerorun.engine.checkpoint.decoupled import settle

    settle(engine)  # a decoupled save still being written is committed (or has failed, raised here) first
    dcp_dir = Path(load_dir) if tag is None else Path(load_dir) / str(tag)
    if dcp_format.is_dcp(dcp_dir) and (tag is None or tag_inside(Path(load_dir), str(tag), "tag=")):
        return dcp_load.load_dcp(engine, dcp_dir, load_module_only, strict, trust_checkpoint)
    if tag is None and not (Path(load_dir) / LATEST).is_file():
        return nothing_to_resume(Path(load_dir))
    path = resolve(Path(load_dir), tag)
    if ds_files.is_deepspeed(path):
        ds = ds_format.read(path, trust_checkpoint)
        manifest, payload = ds_load.as_zerorun(ds, engine)
        read: Callable[[int], dict[str, Any]] = {0: payload}.__getitem__
        extra: dict[str, torch.Tensor] | None = ds.extra
    else:
        manifest = read_manifest(path)
        read = partial(read_rank, path, trust=trust_checkpoint)
        extra = safe_load.load(path / EXTRA, trust_checkpoint) if (path / EXTRA).is_file() else None
    current, _ = layout.engine_layout(engine)
    check_model(manifest, path, current, strict)
    parts, index = layout.owned_parts(engine)
    copies = reshard.plan_copies(manifest.buckets, manifest.world_size,
                                 reshard.chunk_pieces(current, parts, index))
    own = engine.ctx.rank % manifest.world_size
    needed = set(reshard.ranks_to_read(copies)) | {own}
    files = {r: read(r) for r in sorted(needed)}
    client_state = read_client_state(path, own, files, trust_checkpoint)  # before any change to the engine
    optimizer_states = load_optimizer_states and not load_module_only
    with resident(engine.parts.masters):
        _fill(engine, copies, files, optimizer_states)
        layout.publish_masters(engine)
    if extra is not None:
        with gathered_frozen(engine.parts.frozen, modifier_rank=0):  # stage 3: every rank keeps its chunk
            engine.module.load_state_dict(extra, strict=False)
    if not load_module_only:
        state.restore(engine, files[own]["engine"], optimizer_states, load_lr_scheduler_states, load_rng_state)
        if engine.ctx.rank == 0:  # a restarted run says where it picked up and what changed
            print(resume_line(manifest, files[own]["engine"], engine), flush=True)
    engine.parts.grad_sync.zero()
    return str(path), client_state
