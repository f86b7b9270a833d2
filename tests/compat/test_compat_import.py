"""``import deepspeed`` under ZERORUN_AS_DEEPSPEED: every covered submodule, the metadata
integrations check, the errors for what zerorun lacks, and never shadowing a real DeepSpeed.

Each case runs a fresh interpreter with only the environment variable set (no PYTHONPATH):
the installed ``zerorun_deepspeed.pth`` startup hook is what makes ``deepspeed`` importable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerorun.compat import DEEPSPEED_VERSION, SITEDIR
from zerorun.compat.activate import rank_env

COVERED = """
import importlib, importlib.metadata, importlib.util, json
import deepspeed
import deepspeed.comm as dist
from deepspeed import initialize, init_distributed, add_config_arguments, zero, DeepSpeedEngine
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.engine import DeepSpeedEngine as E2
from deepspeed.runtime.lr_schedules import WarmupLR, WarmupDecayLR, WarmupCosineLR
from deepspeed.runtime.utils import set_random_seed, see_memory_usage
from deepspeed.runtime.zero import GatheredParameters, Init
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from deepspeed.utils import logger, log_dist, safe_get_full_grad, safe_get_full_fp32_param
assert deepspeed.zero.Init is Init and zero.GatheredParameters is GatheredParameters and E2 is DeepSpeedEngine
print(json.dumps({"version": deepspeed.__version__, "metadata": importlib.metadata.version("deepspeed"),
                  "spec": importlib.util.find_spec("deepspeed").origin, "file": deepspeed.__file__,
                  "device": get_accelerator().device_name(), "backend": get_accelerator().communication_backend_name()}))
"""


def _python(code: str, value: str | None = "1", pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ZERORUN_AS_DEEPSPEED", "PYTHONPATH")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::UserWarning:torch"})
    if value is not None:
        env["ZERORUN_AS_DEEPSPEED"] = value
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_every_covered_submodule_imports_and_metadata_answers() -> None:
    out = _python(COVERED)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["version"] == got["metadata"] == DEEPSPEED_VERSION == "0.19.8+zerorun"
    assert got["spec"] == got["file"] == str(SITEDIR / "deepspeed" / "__init__.py")
    assert (got["device"], got["backend"]) == ("cpu", "gloo")


def test_without_the_variable_there_is_no_deepspeed() -> None:
    out = _python("import importlib.util; print(importlib.util.find_spec('deepspeed'))", value=None)
    assert out.stdout.strip() == "None", out.stderr


UNSUPPORTED = [
    ("import deepspeed.pipe; deepspeed.pipe.PipelineModule(layers=[])", "pipeline parallelism"),
    ("from deepspeed.pipe import LayerSpec; LayerSpec(None)", "pipeline parallelism"),
    ("from deepspeed.moe.layer import MoE; MoE(hidden_size=8)", "mixture of experts"),
    ("from deepspeed.ops.sparse_attention import SparseSelfAttention; SparseSelfAttention()", "sparse attention"),
    ("import deepspeed.inference.engine as e; e.InferenceEngine(None)", "inference injection"),
    ("from deepspeed.ops.lamb import FusedLamb; FusedLamb([])", "Lamb optimizer"),
    ("from deepspeed.runtime.fp16.onebit import OnebitAdam; OnebitAdam([])", "1-bit optimizers"),
    ("from deepspeed.profiling.flops_profiler import FlopsProfiler; FlopsProfiler(None)", "flops profiler"),
    ("from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF; "
     "UlyssesSPAttentionHF.register_with_transformers()", "deepspeed.runtime.sequence_parallel"),
    ("import deepspeed; deepspeed.init_inference(None)", "inference injection"),
    ("import deepspeed; deepspeed.PipelineModule(layers=[])", "pipeline parallelism"),
    ("import deepspeed; deepspeed.moe.layer.MoE()", "mixture of experts"),
    ("from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('CPUAdamBuilder')",
     "op builders"),
]
"""Each imports without error (as DeepSpeed scripts import at the top) and fails where the feature is used."""


PROBE = """
import json, sys
out = []
for code in json.loads(sys.argv[1]):
    try:
        exec(code, {})
        out.append(["no error", ""])
    except Exception as e:
        out.append([type(e).__name__, str(e).splitlines()[0]])
import deepspeed
out.append([hasattr(deepspeed, "nothing"), hasattr(deepspeed.moe, "__all__")])
print(json.dumps(out))
"""


def test_what_zerorun_lacks_imports_and_raises_naming_it_on_use() -> None:
    """One interpreter runs every snippet (torch imports once); each must raise naming its feature."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"ZERORUN_AS_DEEPSPEED": "1", "OMP_NUM_THREADS": "1"})
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([c for c, _ in UNSUPPORTED])], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    *results, probes = json.loads(proc.stdout.strip().splitlines()[-1])
    for (code, feature), (kind, message) in zip(UNSUPPORTED, results, strict=True):
        assert kind.startswith("Unsupported") and feature in message and "not implemented by zerorun" in message, \
            (code, kind, message)
    assert probes == [False, False]  # unknown top-level names and dunders stay missing


@pytest.fixture
def real_deepspeed(tmp_path: Path) -> Path:
    """Something that looks like an installed DeepSpeed, on a path of its own."""
    pkg = tmp_path / "site" / "deepspeed"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = 'real'\n")
    return tmp_path / "site"


def test_a_real_deepspeed_is_never_shadowed(real_deepspeed: Path) -> None:
    code = "import deepspeed; print(deepspeed.__version__)"
    out = _python(code, pythonpath=str(real_deepspeed))
    assert out.stdout.strip() == "real" and "a real DeepSpeed is installed" in out.stderr
    out = _python(code, value="force", pythonpath=str(real_deepspeed))
    assert out.stdout.strip() == DEEPSPEED_VERSION, out.stderr
    with pytest.warns(UserWarning, match="a real DeepSpeed is installed"):
        assert rank_env({"ZERORUN_AS_DEEPSPEED": "1"}, [str(real_deepspeed)]) == {}
    with pytest.warns(UserWarning, match="a real DeepSpeed is installed"):  # found on the rank's own PYTHONPATH
        assert rank_env({"ZERORUN_AS_DEEPSPEED": "1", "PYTHONPATH": str(real_deepspeed)}, []) == {}


def test_rank_env_puts_the_directory_first_once() -> None:
    env = rank_env({"ZERORUN_AS_DEEPSPEED": "1", "PYTHONPATH": f"/a{os.pathsep}{SITEDIR}"}, [])
    assert env == {"PYTHONPATH": f"{SITEDIR}{os.pathsep}/a"}
    assert rank_env({"ZERORUN_AS_DEEPSPEED": "0"}, []) == {} and rank_env({}, []) == {}


MOE_HELPERS = """
import json, torch
import deepspeed
from deepspeed.moe.utils import (configure_moe_param_groups, has_moe_layers, is_moe_param,
                                 split_params_into_different_moe_groups_for_optimizer,
                                 split_params_into_shared_and_expert_params)
from deepspeed.moe.layer import MoE
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
params = list(model.parameters())
groups = split_params_into_different_moe_groups_for_optimizer(({"params": params, "name": "a", "lr": 0.1},))
wrapped = configure_moe_param_groups(params)
shared, experts = split_params_into_shared_and_expert_params(params)
moe = [is_moe_param(p) for p in params]
params[0].allreduce = False  # how DeepSpeed marks an expert parameter
try:
    split_params_into_different_moe_groups_for_optimizer([{"params": params, "name": "a"}])
    expert_error = ""
except Exception as e:
    expert_error = type(e).__name__ + ": " + str(e).splitlines()[0]
print(json.dumps({"moe": moe, "layers": list(has_moe_layers(model)),
                  "groups": [[len(g["params"]), g["name"], g["lr"]] for g in groups],
                  "same": [g["params"] == params for g in groups],
                  "wrapped": [[len(g["params"]), g["name"]] for g in wrapped],
                  "split": [shared == params, experts], "instance": isinstance(model[0], MoE),
                  "expert_error": expert_error}))
"""


def test_moe_helpers_give_deepspeeds_answer_for_a_model_without_experts() -> None:
    out = _python(MOE_HELPERS)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["moe"] == [False] * 4 and got["layers"] == [False, 0] and got["instance"] is False
    assert got["groups"] == [[4, "a", 0.1]] and got["same"] == [True]  # a tuple becomes a list, groups unchanged
    assert got["wrapped"] == [[4, "dense-params"]] and got["split"] == [True, []]
    assert got["expert_error"].startswith("UnsupportedFeature") and "mixture of experts" in got["expert_error"]


def test_an_exception_name_zerorun_lacks_is_an_exception_it_never_raises() -> None:
    """``except ZeRORuntimeException:`` in a DeepSpeed script (and ``pytest.raises``) needs an exception class."""
    from zerorun.compat.lazy import unsupported_names

    names = unsupported_names("deepspeed.runtime.zero.utils")
    exc = names("ZeRORuntimeException")
    assert issubclass(exc, Exception) and exc is names("ZeRORuntimeException")
    try:
        raise exc("raised by the script itself")
    except exc as e:
        assert str(e) == "raised by the script itself"
    with pytest.raises(ValueError):  # another error passes through an except clause naming it
        try:
            raise ValueError("other")
        except exc:
            pass
    assert not issubclass(names("ZeroStageEnum"), BaseException)  # other names stay stand-ins
