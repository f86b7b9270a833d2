"""The script's ``deepspeed.comm`` collectives in the communication logger: DeepSpeed's ``prof=``,
``log_name=`` arguments and the logger's ``prof_all``/``prof_ops``/``debug`` decide whether and under
which name a call is recorded (:mod:`zerorun.engine.comm.comms_logger`).

A recorded call is made blocking (an asynchronous one is waited for before it returns, its work
still returned), as DeepSpeed does to time it; an unrecorded one costs one flag check.
``size`` is what DeepSpeed's bandwidth formulas take: the input tensor's bytes (an all-gather's
input, a reduce-scatter's output: the per-rank part).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from zerorun.engine.comm.comms_logger import LOGGER


def nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


def timed(raw_name: str, size: int, run: Callable[[], Any], log: dict[str, Any]) -> Any:
    """``run()`` (the collective), recorded as ``log["log_name"]`` (default ``raw_name``) when profiled."""
    if not LOGGER.enabled:
        return run()
    name = str(log.get("log_name", raw_name))
    if not LOGGER.profiles(name, bool(log.get("prof", False))):
        return run()
    if LOGGER.debug:  # DeepSpeed's debug names: the function that called the collective
        name = f"{name} | [Caller Func: {sys._getframe(2).f_code.co_name}]"
    start = time.perf_counter()
    work = run()
    if work is not None:
        work.wait()
    LOGGER.append(raw_name, name, (time.perf_counter() - start) * 1e3, size)
    return work
