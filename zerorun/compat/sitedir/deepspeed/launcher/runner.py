"""``deepspeed.launcher.runner``: DeepSpeed's launcher entry and its resource helpers, on zerorun.

``main(args)`` takes DeepSpeed's ``deepspeed`` arguments and launches with zerorun's
launcher (:mod:`zerorun.compat.ds_command`); the hostfile and include/exclude helpers keep
DeepSpeed's dict shapes and ``ValueError`` (:mod:`zerorun.compat.ds_resources`).
"""

import os

from zerorun.compat.ds_command import DLTS_HOSTFILE, parse_args  # noqa: F401
from zerorun.compat.ds_command import run as main  # noqa: F401
from zerorun.compat.ds_resources import (  # noqa: F401
    apply_num_nodes_and_gpus,
    encode_world_info,
    parse_inclusion_exclusion,
    parse_resource_filter,
)
from zerorun.compat.ds_resources import parse_hostfile_lines as _parse_hostfile  # noqa: F401

DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")


def fetch_hostfile(hostfile_path):  # noqa: ANN001, ANN201  DeepSpeed's signature
    """``{host: slots}`` of the hostfile, or None when there is no such file (DeepSpeed's local fallback)."""
    if not os.path.isfile(hostfile_path):
        return None
    with open(hostfile_path) as f:
        return _parse_hostfile(f.readlines())
