"""bench/memory.py's arithmetic: the systems' dtypes, the element counts of the models it trains and
each system's physical floor (the same arithmetic as ``zerorun estimate``). Pure: no process starts here."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LORA_RANK = 8


def bf16_block(system: str) -> dict[str, Any] | None:
    """The bf16 block of a ``-bf16`` (fp32 masters) or ``-bf16m`` (bf16 masters, gradients, moments) system."""
    if system.endswith("-bf16m"):
        return {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    return {"enabled": True} if system.endswith("-bf16") else None


def masters_of(system: str) -> str:
    return "bf16" if system.endswith("-bf16m") else "fp32"


@dataclass(frozen=True)
class ModelFacts:
    """The element counts the floor needs, from the model's shape."""

    trainable: int
    frozen: int
    unit: int  # trainable elements of one block
    gathered_unit: int  # all elements of one block
    largest_param: int
    activations: int  # bytes of saved activations per rank (fp32)


def block_numel(args: argparse.Namespace) -> int:
    h, f = args.hidden, args.ffn_mult * args.hidden
    return (h * f + f) + (f * h + h)


def model_facts(system: str, args: argparse.Namespace, world: int) -> ModelFacts:
    h, f = args.hidden, args.ffn_mult * args.hidden
    block = (h * f + f) + (f * h + h)
    head = h * h + h
    adapters = LORA_RANK * (h + f) * 2  # fc1's and fc2's down and up projections
    mb = args.global_batch // world
    # per block fc1 keeps its input (h), GELU its input (f), fc2 its input (f): the micro batch's rows
    nbytes = 2 if bf16_block(system) is not None else 4
    per_block = mb * (h + 2 * f) * nbytes
    kept = args.layers * mb * h * nbytes + per_block if system.endswith("-ckpt") else args.layers * per_block
    lora = system.endswith("-lora")
    return ModelFacts(trainable=args.layers * adapters + head if lora else args.layers * block + head,
                      frozen=args.layers * block if lora else 0, unit=adapters if lora else block,
                      gathered_unit=block + (adapters if lora else 0), largest_param=h * f,
                      activations=kept + mb * h * nbytes)


def stage_of(system: str) -> int:
    if system == "torch-ddp":
        return 0
    if system == "torch-fsdp2":
        return 3
    return int(system.split("-z")[1][0])


def floor_bytes(system: str, args: argparse.Namespace, world: int) -> int:
    """The system's physical floor (the same arithmetic as ``zerorun estimate``)."""
    sys.path.insert(0, _ROOT)
    from zerorun.estimate import Dtype, Masters, Optimizer, Training
    from zerorun.estimate.floor import physical_floor

    m = model_facts(system, args, world)
    dtype = Dtype.BF16 if bf16_block(system) is not None else Dtype.FP32
    training = Training(m.trainable, world, dtype, Optimizer.ADAMW, masters=Masters(masters_of(system)))
    # at DeepSpeed's defaults the kept window is the whole model (the floor's gathered term is two units)
    gathered_unit = -(-m.trainable // 2) if system.endswith("-defaults") else m.gathered_unit
    return physical_floor(training, stage_of(system), unit=m.unit, gathered_unit=gathered_unit,
                          bucket=m.largest_param, frozen_params=m.frozen, activations=m.activations).total
