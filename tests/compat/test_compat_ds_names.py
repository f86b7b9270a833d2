"""Names whose absence stopped whole DeepSpeed test files importing, and the generation context manager:
``deepspeed.checkpoint.utils.get_model_ckpt_name_for_rank`` (and siblings), ``deepspeed.runtime.zero.
partition_parameters.MultipleAllGatherHandles`` / ``partitioned_param_data_shape``, ``deepspeed.runtime.zero.
unwrap_model_for_generation`` and ``deepspeed.runtime.zero.leaf_module_config``, under ``import deepspeed``; and
``InsertPostInitMethodToModuleSubClasses`` (the base of ``zero.Init``, with no ``linear_bk``: no torch function is
replaced) and ``zero3_linear_wrap`` (the one of ``deepspeed.runtime.zero.linear``, never installed as ``F.linear``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from zerorun.compat.checkpoint_utils import (
    get_layer_ckpt_name_for_rank,
    get_model_ckpt_name_for_rank,
    get_zero_ckpt_name_for_rank,
)
from zerorun.compat.params import MultipleAllGatherHandles
from zerorun.compat.utils import set_log_level_from_string


def test_checkpoint_file_names_are_deepspeeds() -> None:
    assert get_model_ckpt_name_for_rank("/c/global_step0", "00") == "/c/global_step0/mp_rank_00_model_states.pt"
    assert get_zero_ckpt_name_for_rank("/c/t", 3, 0) == "/c/t/zero_pp_rank_3_mp_rank_00_optim_states.pt"
    assert get_layer_ckpt_name_for_rank("/c/t", "layer_01", 1) == "/c/t/layer_01-model_01_model_states.pt"


def test_multiple_all_gather_handles_pass_the_dependency_by_keyword() -> None:
    class Positional:
        def wait(self, handle_dependency: bool = True) -> None:
            self.got = handle_dependency

    class KeywordOnly:
        def wait(self, *, handle_dependency: bool = True) -> None:
            self.got = handle_dependency

    handles = [Positional(), KeywordOnly()]
    MultipleAllGatherHandles(handles).wait(handle_dependency=False)
    assert [h.got for h in handles] == [False, False]


PROBE = """
import inspect, json
from deepspeed.checkpoint.utils import get_model_ckpt_name_for_rank
from deepspeed.runtime.zero.partition_parameters import MultipleAllGatherHandles, partitioned_param_data_shape
from deepspeed.runtime.zero import unwrap_model_for_generation
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.leaf_module_config import DEFAULT_LEAF_MODULE_CLASSES, DEFAULT_LEAF_MODULE_NAMES
from deepspeed.runtime.zero import ZeroParamStatus, TiledLinear
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus as Status
from deepspeed.utils import set_log_level_from_string, logger
set_log_level_from_string("ERROR")
from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses, zero3_linear_wrap
from deepspeed.runtime.zero import linear as zero_linear
import deepspeed, torch
x, w, b = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)
linear = {"base": issubclass(deepspeed.zero.Init, InsertPostInitMethodToModuleSubClasses),
          "no_backup": not hasattr(InsertPostInitMethodToModuleSubClasses, "linear_bk"),
          "same": torch.equal(zero3_linear_wrap(x, w, b), torch.nn.functional.linear(x, w, b)),
          "torchs": torch.nn.functional.linear is torch._C._nn.linear,
          "wrap": zero3_linear_wrap is zero_linear.zero3_linear_wrap
          and issubclass(zero_linear.LinearFunctionForZeroStage3, torch.autograd.Function)}
zero = DeepSpeedZeroConfig(**{"leaf_module": {"classes": "my.Class"}, "stage3_module_granularity_threshold": 7})
print(json.dumps({"cm": callable(unwrap_model_for_generation) and not inspect.ismodule(unwrap_model_for_generation),
                  "shape": partitioned_param_data_shape, "defaults": DeepSpeedZeroConfig().leaf_module.classes
                  == DEFAULT_LEAF_MODULE_CLASSES and DEFAULT_LEAF_MODULE_NAMES == [],
                  "leaf": zero.leaf_module.classes, "threshold": zero.module_granularity_threshold,
                  "status": ZeroParamStatus is Status and callable(TiledLinear), "level": logger.level, **linear}))
"""


def test_the_names_import_under_deepspeed() -> None:
    env = {**os.environ, "ZERORUN_AS_DEEPSPEED": "force", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"cm": True, "shape": [0], "defaults": True, "leaf": ["my.Class"], "threshold": 7, "status": True,
                   "level": logging.ERROR, "base": True, "no_backup": True, "same": True, "torchs": True,
                   "wrap": True}


def test_log_level_from_a_name_sets_the_logger_and_its_handlers() -> None:
    own = logging.getLogger("zerorun-test-level")
    own.addHandler(logging.NullHandler())
    set_log_level_from_string("Warning", custom_logger=own)
    assert own.level == logging.WARNING and own.handlers[0].level == logging.WARNING
    with pytest.raises(ValueError, match="valid logging levels"):
        set_log_level_from_string("loud", custom_logger=own)
