"""``deepspeed.launcher.multinode_runner``: the base class a custom DeepSpeed runner subclasses.

DeepSpeed's concrete runners (PDSH, OpenMPI, MPICH, Intel MPI, MVAPICH, Slurm) build command
lines for DeepSpeed's own per-node launcher (``deepspeed.launcher.launch``); zerorun's
runners (:mod:`launcher.plan.runners`) take their place, so those names import and refuse on
use. The base class keeps DeepSpeed's contract (``args``, ``world_info_base64``,
``exports``, ``add_export``'s quoting) for code that derives from it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any

from zerorun.errors import unsupported_class

_PLAIN = re.compile(r"[^\w@%+=:,./-]")


class MultiNodeRunner(ABC):
    """DeepSpeed's runner base: ``get_cmd`` turns the environment and resources into a command."""

    def __init__(self, args: Any, world_info_base64: str) -> None:
        self.args = args
        self.validate_args()
        self.user_arguments = self.parse_user_args()
        self.user_script = args.user_script
        self.world_info_base64 = world_info_base64
        self.exports: dict[str, str] = {}

    @abstractmethod
    def backend_exists(self) -> bool:
        """Whether the runner's program is installed."""

    @abstractmethod
    def get_cmd(self, environment: dict[str, str], active_resources: Any) -> Any:
        """The command (and whatever else the runner returns) for ``active_resources``."""

    def add_export(self, key: str, var: str) -> None:
        """Export ``key=var`` to the ranks; a value with shell-special characters is double-quoted."""
        var = var.strip()
        self.exports[key.strip()] = f'"{var}"' if _PLAIN.search(var) else var

    def parse_user_args(self) -> Any:
        return self.args.user_args

    @property
    def name(self) -> str:
        return self.__class__.__name__

    def validate_args(self) -> None:
        """Check the runner's arguments (none by default)."""
        return None

    @classmethod
    def validate_active_resources(cls, active_resources: Any) -> None:
        """Refuse resources the runner cannot express (any by default)."""
        return None


_REASON = "{} runner (zerorun's launcher runs the nodes: `deepspeed --launcher pdsh|openmpi|slurm ...`)"
PDSHRunner = unsupported_class("PDSHRunner", _REASON.format("PDSH"))
OpenMPIRunner = unsupported_class("OpenMPIRunner", _REASON.format("OpenMPI"))
MPICHRunner = unsupported_class("MPICHRunner", _REASON.format("MPICH"))
IMPIRunner = unsupported_class("IMPIRunner", _REASON.format("Intel MPI"))
SlurmRunner = unsupported_class("SlurmRunner", _REASON.format("Slurm"))
MVAPICHRunner = unsupported_class("MVAPICHRunner", _REASON.format("MVAPICH"))

__all__ = ["IMPIRunner", "MPICHRunner", "MVAPICHRunner", "MultiNodeRunner", "OpenMPIRunner", "PDSHRunner",
           "SlurmRunner"]
