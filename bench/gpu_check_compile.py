"""The GPU check's compiled-training rows: ``engine.compile()`` against eager, stages 2 and 3.

``compile/stage{2,3}``: the parity GPT (fp32, AdamW, world 1) trained eagerly and then, from
the same weights and batches, after ``engine.compile(backend="inductor")``: the losses must
agree (rtol 1e-4 on CUDA: inductor's kernels sum in other orders; 1e-6 in the dry mode), and
the row reports compiled/eager step time (median over the steps after the first two), the
first compiled step (the compile itself), and dynamo's graph count and breaks. The dry mode
compiles with the ``eager`` backend: dynamo traces the engine's hooks the same way, without
inductor's minutes of CPU code generation.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from bench.gpu_check_model import Sizes, batch, build, config, loss_of

WARM = 2  # steps left out of the timing: the first compiles, the second may still specialise


def _run(s: Sizes, stage: int, backend: str | None) -> tuple[list[float], list[float]]:
    g = s.parity
    engine = build(g, config(g, stage, "fp32"))
    if backend is not None:
        engine.compile(backend=backend)
    cuda = engine.device.type == "cuda"
    losses, times = [], []
    for i in range(WARM + s.steps):
        x, y = batch(g, i, engine.device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_of(engine(x), y)
        engine.backward(loss)
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    engine.destroy()
    return losses, times


def check_compile(s: Sizes, stage: int, dry: bool) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager_losses, eager_times = _run(s, stage, None)
    compiled_losses, compiled_times = _run(s, stage, "eager" if dry else "inductor")
    rel = max(abs(c - e) / max(abs(e), 1e-12) for c, e in zip(compiled_losses, eager_losses, strict=True))
    eager_s = statistics.median(eager_times[WARM:])
    compiled_s = statistics.median(compiled_times[WARM:])
    return {"passed": rel <= (1e-6 if dry else 1e-4), "backend": "eager" if dry else "inductor",
            "loss_max_rel_diff": rel, "eager_step_s": eager_s, "compiled_step_s": compiled_s,
            "compiled_over_eager": compiled_s / eager_s, "first_compiled_step_s": compiled_times[0],
            "graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}
