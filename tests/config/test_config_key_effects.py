"""No accepted key is a silent no-op: every key of the schema is read by the engine, documented as a
no-op (a warning when set), or refused (an error when set)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel

from zerorun.config import load_config
from zerorun.config.noop import NO_EFFECT
from zerorun.config.problems import ConfigError, ConfigWarning
from zerorun.config.schema import ZerorunConfig

ROOT = Path(__file__).resolve().parents[2]

REFUSED = {  # key -> a value that asks for the refused feature
    "amp.enabled": True,
    "fp16.fp16_master_weights_and_grads": True,
    "bf16.bf16_master_weights_and_grads": True,
    "bf16.bf16_optimizer_states": True,
}


def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        kinds = (*getattr(field.annotation, "__args__", ()), field.annotation)
        sub = next((t for t in kinds if isinstance(t, type) and issubclass(t, BaseModel)), None)
        if sub is not None and name not in ("optimizer", "scheduler"):  # those two are read whole
            out += leaves(sub, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def _readers() -> str:
    dirs = [ROOT / "zerorun" / d for d in ("engine", "compat", "estimate")]
    files = [p for d in dirs for p in d.rglob("*.py")] + [ROOT / "zerorun" / "config" / "rules.py"]  # initialize's checks
    return "\n".join(p.read_text() for p in files)


def test_every_key_is_read_documented_as_no_op_or_refused() -> None:
    source = _readers()
    unread = []
    for key in leaves(ZerorunConfig):
        classes = [key in NO_EFFECT, key in REFUSED]
        assert sum(classes) <= 1, f"{key} is both a no-op and refused"
        if not any(classes) and not re.search(rf"\.{key.split('.')[-1]}\b", source):
            unread.append(key)
    assert unread == [], f"keys nothing in the engine reads: {unread} (read them, add to NO_EFFECT, or refuse them)"


def _nested(key: str, value: object) -> dict:
    out: dict = {"train_batch_size": 1}
    node = out
    *path, last = key.split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return out


@pytest.mark.parametrize(("key", "value"), sorted(REFUSED.items()))
def test_refused_keys_are_errors_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(_nested(key, value))


SAMPLES = {  # a valid non-default value where the default is None or the type is narrow
    "amp.keep_batchnorm_fp32": True, "amp.master_weights": True, "amp.patch_torch_functions": True,
    "amp.cast_model_type": "float16", "amp.loss_scale": 128.0, "amp.min_loss_scale": 1.0, "amp.max_loss_scale": 2.0,
    "amp.verbosity": 2, "amp.opt_level": "O2", "flops_profiler.output_file": "profile.txt",
    "checkpoint.tag_validation": "Fail", "torch_autocast.lower_precision_safe_modules": ["torch.nn.Linear"],
    "zero_optimization.offload_param.max_in_cpu": 7, "zero_optimization.offload_param.buffer_size": 7,
    "data_types.grad_accum_dtype": "fp16",
    "checkpoint.writer.data_parallel": "machine",
}


def _other_value(key: str) -> object:
    if key in SAMPLES:
        return SAMPLES[key]
    default: object = load_config({"train_batch_size": 1})
    for part in key.split("."):
        default = getattr(default, part)
    if isinstance(default, bool):
        return not default
    return default + 1 if isinstance(default, (int, float)) else 7


@pytest.mark.parametrize("key", sorted(k for k in NO_EFFECT if k != "zero_optimization.offload_optimizer.ratio"))
def test_every_no_op_key_warns_when_set(key: str) -> None:
    """(offload_optimizer.ratio below 1 is an error below stage 3: test_config_rules covers it.)"""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(_nested(key, _other_value(key)))
    messages = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert any(key in m and "no effect" in m for m in messages), (key, messages)
