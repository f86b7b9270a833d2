"""The estimate's stacked bars as an image (PNG or SVG), through the optional matplotlib."""

from __future__ import annotations

from pathlib import Path

from zerorun.errors import ZerorunError
from zerorun.estimate.counts import gib
from zerorun.estimate.memory_model import GPU_TERMS, Estimate

COLOURS = {
    "params": "#4c72b0", "gradients": "#55a868", "optimizer_states": "#dd8452", "grad_accum": "#c44e52",
    "buffers": "#8172b3", "in_flight": "#64b5cd", "activations": "#da8bc3", "overhead": "#8c8c8c",
}


class PlotError(ZerorunError):
    """The chart cannot be written."""


def write_plot(est: Estimate, path: str | Path) -> Path:
    """Draw one horizontal stacked bar per row, GiB on the x axis, the GPU's memory as a line."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise PlotError(f"{path}: --plot writes .png or .svg files", hint="for example --plot estimate.png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("--plot needs matplotlib, which is not installed", hint="pip install 'zerorun[plot]'") from None
    labels = [row.placement.label for row in est.rows]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(labels) + 1.5))
    left = [0.0] * len(labels)
    for term in GPU_TERMS:
        widths = [gib(row.gpu[term]) for row in est.rows]
        if any(widths):
            ax.barh(labels, widths, left=left, color=COLOURS[term], label=term.replace("_", " "))
            left = [a + b for a, b in zip(left, widths, strict=True)]
    if est.request.gpu_memory is not None:
        ax.axvline(gib(est.request.gpu_memory), color="black", linestyle="--", label="GPU memory")
    ax.invert_yaxis()
    ax.set_xlabel("GiB per GPU (2^30 bytes)")
    ax.set_title(f"{est.request.training.params / 1e9:.2f}B parameters on {est.request.training.world_size} GPUs")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as err:
        raise PlotError(f"{path}: cannot write the chart ({err.strerror})", hint="check the directory exists") from None
    finally:
        plt.close(fig)
    return path
