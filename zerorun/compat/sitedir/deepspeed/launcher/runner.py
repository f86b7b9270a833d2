"""``deepspeed.launcher.runner``: DeepSpeed's constants that integrations read (accelerate's launch).

Launch with ``zerorun --num_gpus N script.py`` (or ``--hostfile``); ``main`` is that CLI.
"""

import os

DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")


def main(args=None):  # noqa: ANN001, ANN201  DeepSpeed's signature
    """The ``zerorun`` launcher (imported here only: the library works without the CLI's packages)."""
    from zerorun.cli import main as cli_main

    return cli_main(args)
