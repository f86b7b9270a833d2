"""``deepspeed`` backed by zerorun (see ``zerorun.compat``): not DeepSpeed itself."""

from zerorun.compat.lazy import install_finder
from zerorun.compat.surface import *  # noqa: F403
from zerorun.compat.surface import (  # noqa: F401
    __all__,
    __git_branch__,
    __git_hash__,
    __version__,
    __version_major__,
    __version_minor__,
    __version_patch__,
)
from zerorun.compat.surface import missing_attribute as __getattr__  # noqa: E402,F401  submodules on first access

install_finder()  # any deepspeed.* module without a file here imports, and fails where it is used

from . import accelerator, comm, ops, runtime, utils  # noqa: F401,E402  DeepSpeed imports these eagerly too
from .runtime import zero  # noqa: F401,E402  deepspeed.zero is deepspeed.runtime.zero, as in DeepSpeed
