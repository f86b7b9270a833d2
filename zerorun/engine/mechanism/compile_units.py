"""Stage 3 under ``torch.compile``: each repeated block is one gather unit, compiled inside its hooks.

A unit's gather and release run in module hooks, which are Python state and collectives: the
compiler cannot trace them, so each one inside a compiled region is a graph break, and at
DeepSpeed's granularity (one unit per module with parameters) a transformer block holds a
dozen. FSDP2 with torchtitan's recipe (``fully_shard`` then ``torch.compile`` per block) keeps
the collectives out of the graphs instead, and so does this module:

* the *blocks* are the children of every ``ModuleList``/``Sequential`` of two or more modules
  of one class that hold parameters (a GPT's ``h``, a Llama's ``layers``), as accelerate's
  regional compilation picks them;
* every unit inside a block is merged into one unit at the block (what ``_z3_leaf`` does at
  ``initialize``): the block's forward pre-hook gathers all its buckets, its post-hook
  releases them, the hook on its outputs gathers them again for backward;
* each block's ``forward`` (not ``__call__``) is compiled, so the hooks run eagerly around
  one graph per block, and the blocks of one class share that graph (torch inlines built-in
  modules and lifts their parameters as graph inputs: no recompile per block or per bucket).

The parameters a compiled block reads are always gathered, plain views of their buffers:
the guard's ``__class__`` swap (:mod:`zerorun.engine.mechanism.guard`) happens in the hooks,
outside every graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from zerorun.engine.mechanism.gather import Unit

ROOT_UNIT = "<root>"


def repeated_blocks(root: nn.Module) -> list[nn.Module]:
    """The children of each container of >= 2 same-class modules with parameters (outermost first)."""
    picked: list[nn.Module] = []
    inside: set[int] = set()
    for m in root.modules():
        if id(m) in inside or not isinstance(m, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(m.children())
        if (len(children) >= 2 and len({type(c) for c in children}) == 1
                and any(True for _ in children[0].parameters())):
            picked.extend(children)
            inside.update(id(d) for c in children for d in c.modules())
    return picked


def _owner(name: str, block_names: list[str]) -> str | None:
    if name == ROOT_UNIT:
        return None
    return next((b for b in block_names if name == b or name.startswith(b + ".")), None)


def block_units(root: nn.Module, units: list[Unit], unit_buckets: list[list[int]],
                blocks: list[nn.Module]) -> tuple[list[Unit], list[nn.Module]]:
    """``units`` with each block's units merged into one leaf unit at the block, and the module of each.

    ``unit_buckets``: the buckets each unit gathers now (its own, and those its forward touched).
    Units outside every block stay as they are; the order is the first-seen order of ``units``.
    """
    names = {id(m): n for n, m in root.named_modules()}
    block_names = [names[id(b)] for b in blocks]
    merged: dict[str, tuple[list[int], bool]] = {}
    for u in units:
        owner = _owner(u.name, block_names)
        buckets, leaf = merged.setdefault(owner or u.name, ([], u.leaf or owner is not None))
        buckets.extend(bi for bi in unit_buckets[u.index] if bi not in buckets)
    by_name = dict(root.named_modules())
    new = [Unit(i, name, tuple(sorted(bs)), leaf) for i, (name, (bs, leaf)) in enumerate(merged.items())]
    return new, [root if u.name == ROOT_UNIT else by_name[u.name] for u in new]


def compile_forward(module: nn.Module, compiler: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """``module.forward`` compiled, its ``__call__`` (and so its hooks) left eager."""
    module.forward = compiler(module.forward)  # type: ignore[method-assign]
