"""``engine.compile()`` with DeepSpeed's signature, and ``engine.is_compiled``.

Mixed into :class:`zerorun.engine.engine.Engine`. accelerate (and so Hugging Face's Trainer with
``torch_compile=True``) calls ``engine.compile(backend=..., compile_kwargs={...})`` on a DeepSpeed
engine right after ``initialize``; DeepSpeed compiles the wrapped module in place
(``module.compile(backend=backend, **compile_kwargs)``), once (a second call does nothing).

* Parameters replicated (stages 0-2): the same, the whole module in place. The engine adds
  nothing to the forward (gradients are taken by hooks outside the graph), so it is one graph.
* Parameters sharded (stage 3): each repeated block becomes one gather unit and its ``forward``
  is compiled, the gather/release hooks left eager around it (FSDP2's per-block recipe:
  :mod:`zerorun.engine.mechanism.compile_units`). The modules outside the blocks (embeddings,
  final norm, head) run eagerly. A model without repeated blocks is compiled whole, as at
  stages 0-2, and breaks at every unit's hooks (a warning says so).

DeepCompile (the config's ``compile.deepcompile``, and ``schedule=``) is DeepSpeed's own compiler
pass and is refused; ``compiled_autograd_enabled=True`` is refused too: the engine's gradient
hooks reduce buckets while backward runs, which a compiled backward graph would not call.
The config's ``"compile": {"enabled": true, "backend": ..., "kwargs": {...}}`` (DeepSpeed
0.13.2-0.14.3's keys) calls this at ``initialize``.

What stays eager, and why (measured on the 4-block GPT of ``bench/compile.py``, CPU, 2 gloo ranks:
``bench/compile_phases.py`` and BENCHMARKS.md):

* the optimizer step: the engine steps the user's optimizer over a few flat shards, so it is a
  handful of large kernels already (AdamW over the rank's 1.7M elements: ~9 ms, two chunks, of a ~480 ms step);
  compiling it would recompile per step chunk, and the user's ``fused=True`` gives the one-pass
  kernel without it (about 1 ms per 1.7M elements);
* at stage 3 the root's own compute (embedding, final norm, head: about 1% of the step, the head's
  matmul unchanged by compile): the root's forward loops over the blocks, whose gathers must stay
  outside every graph; dynamo then skips the root's frame or traces into the blocks' hooks and
  their sharded parameters;
* the gathers, reductions and the step's collectives (module and gradient hooks).

On a CPU the matmuls (oneDNN/BLAS either way) are ~65-75% of such a step, so compile's fusions of the
rest save a few per cent; that bound, not the engine, caps the gain there. The engine's heap trim
on the CPU skips a heap with little free (a trim every step took all of compile's gain at stage 2
on a small GPT; BENCHMARKS.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.mechanism import grad_landing
from zerorun.engine.mechanism.compile_units import block_units, compile_forward, repeated_blocks
from zerorun.errors import unsupported

if TYPE_CHECKING:
    from torch import nn

    from zerorun.engine.build import Parts


class CompileSurface:
    module: nn.Module
    parts: Parts
    compiled_regions: list[str] = []  # noqa: RUF012  # what engine.compile() compiled (module names; "" the whole)
    """Names of the modules whose forward ``compile()`` compiled (``""``: the whole module)."""

    @property
    def is_compiled(self) -> bool:
        """Whether :meth:`compile` has run (DeepSpeed's ``engine.is_compiled``)."""
        return bool(self.__dict__.get("_is_compiled", False))

    def compile(self, backend: str | Callable[..., Any] = "inductor", compile_kwargs: dict[str, Any] | None = None,
                schedule: object | None = None, compiled_autograd_enabled: bool = False) -> None:
        """Compile the model with ``torch.compile(backend=backend, **compile_kwargs)``; a second call does nothing.

        ``compile_kwargs`` are ``torch.compile``'s (``mode``, ``fullgraph``, ``dynamic``, ``options``);
        a ``backend`` among them is overridden by ``backend`` (DeepSpeed warns so too)."""
        if schedule is not None:
            unsupported("DeepCompile's engine.compile(schedule=...)", "drop schedule: zerorun compiles with "
                        "torch.compile alone (its gathers stay in module hooks)")
        if compiled_autograd_enabled:
            unsupported("engine.compile(compiled_autograd_enabled=True)",
                        "leave it False: the engine reduces gradient buckets from hooks while backward runs")
        if self.is_compiled:
            return
        kwargs = dict(compile_kwargs or {})
        if "backend" in kwargs:
            warnings.warn("the `backend` in `compile_kwargs` is overridden: use the `backend` argument instead",
                          UserWarning, stacklevel=2)
        kwargs["backend"] = backend
        grad_landing.uninstall(self.module)  # the graphs keep torch's Linear (its gradients are copied as before)
        coordinator = self.parts.coordinator
        blocks = repeated_blocks(self.module) if coordinator is not None else []
        if coordinator is not None and not blocks:
            warnings.warn("engine.compile(): the model has no repeated blocks (a ModuleList/Sequential of one "
                          "class), so stage 3 compiles it whole and breaks the graph at each unit's gather",
                          RuntimeWarning, stacklevel=2)
        if not blocks:
            self.module.compile(**kwargs)
            self.compiled_regions = [""]
        else:
            assert coordinator is not None
            units, modules = block_units(self.module, coordinator.units, coordinator.unit_buckets, blocks)
            coordinator.regroup(self.module, units, modules)
            self.parts.units[:] = units  # the same list ParameterOffload re-attaches hooks from
            for block in blocks:
                compile_forward(block, lambda fn: torch.compile(fn, **kwargs))
            names = {id(m): n for n, m in self.module.named_modules()}
            self.compiled_regions = [names[id(b)] for b in blocks]
        self.__dict__["_is_compiled"] = True
