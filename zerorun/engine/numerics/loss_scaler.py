"""Loss scaling for fp16, with DeepSpeed's semantics. Pure functions over a frozen state.

``loss_scale > 0`` is a static scale. ``loss_scale == 0`` is dynamic: start at
``2**initial_scale_power``; an overflow (inf/nan gradient on any rank) skips the step and,
once ``hysteresis`` overflows have been absorbed, halves the scale (never below
``min_loss_scale``); after ``loss_scale_window`` steps without overflow the scale doubles.
With ``consecutive_hysteresis`` a clean step refills the hysteresis budget.
bf16 and fp32 use the constant scale 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ScalerPolicy:
    dynamic: bool
    initial_scale: float = 1.0
    window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_scale: float = 1.0
    factor: float = 2.0


@dataclass(frozen=True)
class ScalerState:
    scale: float
    iteration: int = 0
    last_overflow_iter: int = -1
    hysteresis_left: int = 1


def constant(scale: float = 1.0) -> ScalerPolicy:
    return ScalerPolicy(dynamic=False, initial_scale=scale)


def initial_state(policy: ScalerPolicy) -> ScalerState:
    return ScalerState(scale=policy.initial_scale, hysteresis_left=policy.hysteresis)


def update(state: ScalerState, policy: ScalerPolicy, overflow: bool) -> ScalerState:
    """The scaler after one optimizer step (DeepSpeed's ``DynamicLossScaler.update_scale``)."""
    if not policy.dynamic:
        return replace(state, iteration=state.iteration + 1)
    scale, hyst = state.scale, state.hysteresis_left
    last = state.last_overflow_iter
    if overflow:
        if policy.hysteresis == 1 or hyst == 1:
            scale = max(scale / policy.factor, policy.min_scale)
        else:
            hyst -= 1
        last = state.iteration
    else:
        if policy.consecutive_hysteresis:
            hyst = policy.hysteresis
        if (state.iteration - last) % policy.window == 0:
            if not policy.consecutive_hysteresis:
                hyst = policy.hysteresis
            scale *= policy.factor
    return ScalerState(scale=scale, iteration=state.iteration + 1, last_overflow_iter=last,
                       hysteresis_left=hyst)
