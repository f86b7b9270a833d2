"""``deepspeed.launcher.multinode_runner`` -> :mod:`zerorun.compat.multinode_runner`."""

from zerorun.compat.multinode_runner import *  # noqa: F403
