"""Run DeepSpeed scripts unchanged: a ``deepspeed`` package backed by zerorun.

``zerorun --as_deepspeed train.py`` (or ``ZERORUN_AS_DEEPSPEED=1`` for ``python`` /
``torchrun``) makes ``import deepspeed`` and ``from deepspeed.X import Y`` resolve to
zerorun inside the ranks, so a DeepSpeed script needs no edit at all.

How: ``zerorun/compat/sitedir/`` is a directory meant for ``sys.path``. It holds

* ``deepspeed/`` - a real top-level package whose modules are thin re-exports of
  ``zerorun.compat.*`` (the implementation lives here, importable and testable under
  its own name; the forwarders only give it DeepSpeed's module paths), and
* ``deepspeed-<ver>.dist-info/METADATA`` so ``importlib.metadata.version("deepspeed")``
  answers :data:`DEEPSPEED_VERSION` - integrations (transformers, accelerate) check it.

:mod:`zerorun.compat.activate` decides whether to put that directory first on the path:
the launcher's agent does it for each rank's ``PYTHONPATH``; the ``zerorun_deepspeed.pth``
startup hook does it for a plain interpreter. A real installed DeepSpeed is never
shadowed unless ``ZERORUN_AS_DEEPSPEED=force``.

Anything zerorun does not implement (pipeline, sparse attention, inference injection,
1-bit optimizers, MoE, ...) imports (:mod:`zerorun.compat.lazy`) and raises
:class:`~zerorun.errors.UnsupportedFeature` naming it at first use - never a
silent no-op; helpers whose answer is known without the feature give DeepSpeed's answer.
"""

from __future__ import annotations

from pathlib import Path

ENV_VAR = "ZERORUN_AS_DEEPSPEED"
# The DeepSpeed release whose semantics zerorun matches, with a local label that says it is
# not DeepSpeed itself; `packaging` compares it as 0.19.8 (so `>=0.9.3` checks pass).
DEEPSPEED_VERSION = "0.19.8+zerorun"
SITEDIR = Path(__file__).resolve().parent / "sitedir"

__all__ = ["DEEPSPEED_VERSION", "ENV_VAR", "SITEDIR"]
