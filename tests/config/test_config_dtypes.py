"""Every dtype field of the schema takes every spelling DeepSpeed 0.19.8's DtypeEnum accepts."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from zerorun.config.dtypes import SPELLINGS, canonical_dtype
from zerorun.config.schema import ZerorunConfig

# DeepSpeed 0.19.8 runtime/config.py DtypeEnum (int8 aside: no zerorun field takes it)
DEEPSPEED_SPELLINGS = {
    "fp16": ("torch.float16", "fp16", "float16", "half"),
    "fp32": ("torch.float32", "fp32", "float32", "float"),
    "bf16": ("torch.bfloat16", "bf16", "bfloat16"),
}


def _is_dtype_validator(meta: Any) -> bool:
    return "dtype_choice" in getattr(getattr(meta, "func", None), "__qualname__", "")


def _annotations(annotation: Any) -> list[Any]:
    out = [annotation]
    for arg in typing.get_args(annotation):
        out += _annotations(arg)
    return out


def dtype_fields(model: type[BaseModel], prefix: str = "") -> dict[str, tuple[str, ...]]:
    """Every field read through dtype_choice -> the canonical names it allows (walks nested blocks)."""
    found: dict[str, tuple[str, ...]] = {}
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        metas = list(field.metadata) + [m for a in _annotations(field.annotation) for m in getattr(a, "__metadata__", ())]
        for meta in metas:
            if _is_dtype_validator(meta):
                allowed = [a for a in _annotations(field.annotation) if typing.get_origin(a) is typing.Literal]
                found[path] = tuple(v for lit in allowed for v in typing.get_args(lit))
        for sub in _annotations(field.annotation):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                found.update(dtype_fields(sub, f"{path}."))
    return found


def nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    here = out
    *parents, leaf = path.split(".")
    for p in parents:
        here = here.setdefault(p, {})
    here[leaf] = value
    return out


FIELDS = dtype_fields(ZerorunConfig)


def test_the_walk_finds_every_field_that_names_a_dtype() -> None:
    assert {"communication_data_type", "torch_autocast.dtype", "amp.cast_model_type"} <= set(FIELDS)

    def named(model: type[BaseModel], prefix: str = "") -> set[str]:
        out = set()
        for name, field in model.model_fields.items():
            blocks = [s for s in _annotations(field.annotation) if isinstance(s, type) and issubclass(s, BaseModel)]
            if ("dtype" in name or "data_type" in name or name == "cast_model_type") and not blocks:
                out.add(f"{prefix}{name}")  # a block (data_types) is walked below, not a dtype itself
            for sub in blocks:
                out |= named(sub, f"{prefix}{name}.")
        return out

    assert named(ZerorunConfig) <= set(FIELDS)  # no dtype field reads its value another way


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_every_deepspeed_spelling_is_read_as_its_dtype(path: str) -> None:
    for name, spellings in DEEPSPEED_SPELLINGS.items():
        assert set(spellings) <= set(SPELLINGS[name])
        for spelling in spellings + tuple(s.upper() for s in spellings):
            if name in FIELDS[path]:
                cfg = ZerorunConfig.model_validate(nested(path, spelling))
                value: Any = cfg
                for part in path.split("."):
                    value = getattr(value, part)
                assert value == name, (path, spelling)
            else:
                with pytest.raises(ValidationError, match="is not a dtype here"):
                    ZerorunConfig.model_validate(nested(path, spelling))


def test_a_torch_dtype_object_and_nonsense() -> None:
    import torch

    assert canonical_dtype(torch.bfloat16) == "bf16" and canonical_dtype(torch.half) == "fp16"
    assert canonical_dtype("bfloat") is None and canonical_dtype(16) is None
    with pytest.raises(ValidationError, match='"bfloat" is not a dtype here: use one of fp32'):
        ZerorunConfig.model_validate({"communication_data_type": "bfloat"})
