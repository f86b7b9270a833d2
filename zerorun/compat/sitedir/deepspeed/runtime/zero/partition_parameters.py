"""``deepspeed.runtime.zero.partition_parameters`` -> :mod:`zerorun.compat.params`."""

from zerorun.compat.accelerator import get_accelerator  # noqa: F401  transformers reads it here
from zerorun.compat.params import *  # noqa: F403
from zerorun.compat.tensor_constructors import (  # noqa: F401  names transformers patches around zero.Init
    _orig_torch_arange,
    _orig_torch_empty,
    _orig_torch_full,
    _orig_torch_ones,
    _orig_torch_zeros,
    zero_wrapper_for_fp_tensor_constructor,
)
from zerorun.compat.zero_init import (  # noqa: F401
    Init,
    InsertPostInitMethodToModuleSubClasses,
    register_external_parameter,
    zero3_linear_wrap,
)
from zerorun.engine.comm.launcher_world import (  # noqa: F401  the check zero.Init runs, by DeepSpeed's name
    contradicting_single_rank_group as _contradicting_single_rank_pg_error,
)
from zerorun.zero import GatheredParameters  # noqa: F401
