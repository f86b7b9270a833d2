"""``deepspeed.ops.op_builder``: DeepSpeed's op builders, none of which zerorun builds.

Scripts probe ``CPUAdamBuilder().is_compatible()`` (or ``AsyncIOBuilder``) before choosing
a code path: every builder answers False, and says why when ``verbose``; ``load()`` /
``jit_load()`` / ``builder()`` raise :class:`~zerorun.errors.UnsupportedFeature`.
zerorun's own optimizers (``deepspeed.ops.adam``) and NVMe offload need no compiled op.
"""

from __future__ import annotations

import sys
from typing import Any

from zerorun.errors import unsupported

REASON = ("zerorun builds no DeepSpeed C++/CUDA op; deepspeed.ops.adam's optimizers and NVMe offload run "
          "on torch without one")


class OpBuilder:
    """A DeepSpeed op builder that is never compatible: probes answer False, building raises."""

    NAME = "op"
    BUILD_VAR = "DS_BUILD_OPS"

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.NAME
        self.error_log: str | None = None

    def absolute_name(self) -> str:
        return f"deepspeed.ops.{self.name}_op"

    def is_compatible(self, verbose: bool = False) -> bool:
        self.error_log = f"{self.name}: {REASON}"
        if verbose:
            print(self.error_log, file=sys.stderr)
        return False

    def _refuse(self, verb: str) -> Any:
        unsupported(f"op builders ({type(self).__name__}().{verb}())",
                    "use zerorun's optimizers (deepspeed.ops.adam.FusedAdam / DeepSpeedCPUAdam are torch's Adam)")

    def load(self, verbose: bool = True) -> Any:
        return self._refuse("load")

    def jit_load(self, verbose: bool = True) -> Any:
        return self._refuse("jit_load")

    def builder(self) -> Any:
        return self._refuse("builder")


def _builder_class(class_name: str) -> type[OpBuilder]:
    name = class_name.removesuffix("Builder").lower() or "op"
    return type(class_name, (OpBuilder,), {"NAME": name, "__doc__": f"DeepSpeed's {class_name}: never compatible."})


BUILDER_NAMES = ("AsyncIOBuilder", "CPUAdagradBuilder", "CPUAdamBuilder", "CPULionBuilder", "DeepCompileBuilder",
                 "EvoformerAttnBuilder", "FPQuantizerBuilder", "FusedAdamBuilder", "FusedLambBuilder",
                 "FusedLionBuilder", "GDSBuilder", "InferenceBuilder", "InferenceCoreBuilder",
                 "InferenceCutlassBuilder", "PinMemoryBuilder", "QuantizerBuilder", "RaggedOpsBuilder",
                 "RaggedUtilsBuilder", "RandomLTDBuilder", "SparseAttnBuilder", "SpatialInferenceBuilder",
                 "StochasticTransformerBuilder", "TransformerBuilder", "TransformerInferenceBuilder",
                 "UtilsBuilder")
"""The builders of DeepSpeed 0.19.8's ``op_builder`` package (CPU and CUDA)."""

globals().update({n: _builder_class(n) for n in BUILDER_NAMES})
ALL_OPS = {cls.NAME: cls() for cls in (globals()[n] for n in BUILDER_NAMES)}
COMPATIBLE_OPS = {name: name in ("fusedadam", "cpuadam") for name in ALL_OPS}
"""``deepspeed.ops.__compatible_ops__``: True where the op's Python front works here (FusedAdam and
DeepSpeedCPUAdam run on torch's Adam), which is what scripts probe it for; no op is ever built."""


def get_default_compute_capabilities() -> str:
    return ""


def __getattr__(name: str) -> type[OpBuilder]:
    """A builder DeepSpeed adds later answers the same way."""
    if name.endswith("Builder") and not name.startswith("_"):
        return _builder_class(name)
    raise AttributeError(f"module 'deepspeed.ops.op_builder' (zerorun) has no attribute {name!r}")


__all__ = ["ALL_OPS", "COMPATIBLE_OPS", "OpBuilder", "get_default_compute_capabilities", *BUILDER_NAMES]
