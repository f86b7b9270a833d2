"""Mixed-precision policy: the compute dtype, where the fp32 master lives, and the loss scaler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from zerorun.engine.errors import EngineError
from zerorun.engine.numerics import loss_scaler

if TYPE_CHECKING:
    from zerorun.config.schema import ZerorunConfig

_COMM_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PrecisionPolicy:
    """``compute_dtype``: the dtype of the module's parameters, activations and gradients.

    ``master_dtype``: the dtype of the master weights, their reduced gradients and (through
    the optimizer, which makes its state like its parameters) the moments: fp32, or bf16 with
    ``bf16.bf16_master_weights_and_grads`` + ``bf16_optimizer_states``. When it equals the
    compute dtype the master is the parameter buffer itself (no copy: fp32 training, and bf16
    masters over bf16 parameters); otherwise it is a separate tensor.
    """

    compute_dtype: torch.dtype
    scaler: loss_scaler.ScalerPolicy
    comm_dtype: torch.dtype | None
    master_dtype: torch.dtype = torch.float32
    # bf16 masters' step (numerics.compensated): nearest (bf16.master_compensation: none), kahan or
    # stochastic_rounding; "none" with fp32 masters (the optimizer steps them as they are)
    compensation: str = "none"

    @property
    def master_is_alias(self) -> bool:
        return self.compute_dtype == self.master_dtype

    @property
    def name(self) -> str:
        return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.compute_dtype]


def from_config(cfg: ZerorunConfig) -> PrecisionPolicy:
    fp16, bf16 = cfg.fp16.enabled, cfg.bf16.enabled
    if fp16 and bf16:
        raise EngineError("fp16.enabled and bf16.enabled are both true",
                          "enable at most one of fp16 / bf16 in the config")
    comm = None if cfg.communication_data_type is None else _COMM_DTYPES[cfg.communication_data_type]
    if fp16:
        f = cfg.fp16
        if f.loss_scale and f.loss_scale > 0:
            scaler = loss_scaler.constant(float(f.loss_scale))
        else:
            scaler = loss_scaler.ScalerPolicy(
                dynamic=True, initial_scale=float(2 ** f.initial_scale_power), window=int(f.loss_scale_window),
                hysteresis=int(f.hysteresis), consecutive_hysteresis=bool(f.consecutive_hysteresis),
                min_scale=float(f.min_loss_scale))
        return PrecisionPolicy(torch.float16, scaler, comm)
    dtype = torch.bfloat16 if bf16 else torch.float32
    low = bf16 and cfg.bf16.bf16_master_weights_and_grads
    return PrecisionPolicy(dtype, loss_scaler.constant(1.0), comm, master_dtype=dtype if low else torch.float32,
                           compensation=_step_mode(cfg.bf16.master_compensation) if low else "none")


def _step_mode(compensation: str) -> str:
    """bf16 masters always step in fp32 arithmetic; ``none`` rounds the result to nearest."""
    return "nearest" if compensation == "none" else compensation
