"""``ZeROOrderedDict`` / ``ensure_zero_ordered_dict`` (zerorun.engine.surface.zero_ordered_dict), without a
process group: conversion keeps the parameters, their order and the first original dict; a module attached
under a converted one (at any depth) is converted as it is attached; modules elsewhere are left alone; a copy
of a converted module is one too. The engine installs it at stage 3: tests/engine/test_engine_stage3_ds_fidelity.py.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.surface.zero_ordered_dict import ZeROOrderedDict, ensure_zero_ordered_dict, install


def test_conversion_keeps_the_parameters_and_the_first_original() -> None:
    m = nn.Linear(3, 2)
    first = torch_compat.own_parameters(m)
    ensure_zero_ordered_dict(m)
    converted = torch_compat.own_parameters(m)
    assert isinstance(converted, ZeROOrderedDict) and converted._parent_module is m and not converted._in_forward
    assert list(converted) == ["weight", "bias"] and converted["weight"] is m.weight
    assert m._original_parameters is first
    ensure_zero_ordered_dict(m)  # idempotent
    assert torch_compat.own_parameters(m) is converted and m._original_parameters is first
    torch_compat.set_own_parameters(m, dict(converted))  # replaced again: the first original is kept
    ensure_zero_ordered_dict(m)
    assert m._original_parameters is first and isinstance(torch_compat.own_parameters(m), ZeROOrderedDict)
    assert m(torch.ones(1, 3)).shape == (1, 2) and [n for n, _ in m.named_parameters()] == ["weight", "bias"]


def test_what_is_not_a_module_is_left_alone() -> None:
    class Bare:
        _parameters = None

    ensure_zero_ordered_dict(Bare())
    ensure_zero_ordered_dict(object())


def test_modules_attached_under_a_converted_one_are_converted() -> None:
    root = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    install(root)
    assert all(isinstance(torch_compat.own_parameters(m), ZeROOrderedDict) for m in root.modules())
    late = nn.Sequential(nn.Linear(2, 2))
    root[1].late = late  # two levels down, with a child of its own
    assert all(isinstance(torch_compat.own_parameters(m), ZeROOrderedDict) for m in late.modules())
    elsewhere = nn.Module()
    elsewhere.child = nn.Linear(2, 2)  # under an unconverted module: untouched
    assert type(torch_compat.own_parameters(elsewhere.child)) is not ZeROOrderedDict
    twin = copy.deepcopy(root)  # DeepSpeed's own dict needs its parent to be built; this one copies
    assert isinstance(torch_compat.own_parameters(twin[0]), ZeROOrderedDict)
    assert torch.equal(twin[0].weight, root[0].weight) and twin[0].weight is not root[0].weight
