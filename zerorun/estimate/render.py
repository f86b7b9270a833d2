"""The terminal view of an estimate: a table per variant, stacked bars, the recommendation.

Imported only by the CLI layer (it needs rich); the model itself stays terminal-free.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zerorun.estimate.counts import gib
from zerorun.estimate.memory_model import Estimate, Row

# term -> (column header, bar character, colour); distinct characters keep the bars readable without colour
TERMS: dict[str, tuple[str, str, str]] = {
    "params": ("params", "█", "blue"),
    "gradients": ("grads", "▓", "green"),
    "optimizer_states": ("optim", "▒", "yellow"),
    "grad_accum": ("fp32 grad", "░", "dark_orange"),
    "buffers": ("buffers", "≡", "magenta"),
    "activations": ("activ.", "#", "red"),
    "overhead": ("overhead", "·", "grey50"),
}
BAR_WIDTH = 44


def _fmt(n_bytes: int) -> str:
    return "-" if n_bytes == 0 else f"{gib(n_bytes):.1f}"


def _fits(row: Row) -> Text:
    if row.fits is None:
        return Text("?", style="dim")
    return Text("yes", style="green") if row.fits else Text("no", style="red")


def estimate_table(est: Estimate) -> Table:
    """One row per stage/offload variant; every memory column in GiB (2^30 bytes)."""
    r = est.request
    shown = [t for t in TERMS if any(row.gpu[t] for row in est.rows)]
    any_nvme = any(row.nvme_per_node for row in est.rows)
    title = (
        f"{r.training.params:,} parameters ({r.training.params / 1e9:.2f}B), {r.training.dtype.value}, "
        f"{r.training.optimizer.value}, {r.nodes} node(s) x {r.gpus_per_node} GPU(s) = {r.training.world_size}"
    )
    table = Table(
        title=title,
        caption="GiB (2^30 bytes) per GPU, CPU per node; * = recommended",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("stage", justify="center")
    table.add_column("offload", no_wrap=True)
    for t in shown:
        table.add_column(TERMS[t][0], justify="right", no_wrap=True)
    table.add_column("total", justify="right", style="bold", no_wrap=True)
    table.add_column("CPU/node", justify="right", no_wrap=True)
    if any_nvme:
        table.add_column("NVMe/node", justify="right", no_wrap=True)
    table.add_column("fits", justify="center")
    for row in est.rows:
        best = est.recommendation.row is row
        style = "bold" if best else ""
        cells = [Text(f"{row.placement.stage}{' *' if best else ''}", style=style), Text(row.placement.offload_label, style=style)]
        cells += [Text(_fmt(row.gpu[t])) for t in shown]
        cells += [Text(f"{gib(row.total):.1f}"), Text(_fmt(row.cpu_per_node))]
        if any_nvme:
            cells.append(Text(_fmt(row.nvme_per_node)))
        cells.append(_fits(row))
        table.add_row(*cells)
    return table


def bar(row: Row, scale: float, gpu_memory: int | None, width: int = BAR_WIDTH) -> Text:
    """One stacked bar; ``scale`` is bytes per character; ``│`` marks the GPU's memory."""
    cells: list[tuple[str, str]] = []
    used = 0
    for term, (_, char, colour) in TERMS.items():
        count = round((used + row.gpu[term]) / scale) - round(used / scale)
        used += row.gpu[term]
        cells += [(char, colour)] * count
    if len(cells) > width:  # far over the GPU's memory: clip, and say so
        cells = cells[: width - 1] + [("▶", "bold red")]
    if gpu_memory is not None:
        line = min(round(gpu_memory / scale), width)
        cells += [(" ", "")] * (line + 1 - len(cells))
        cells[line] = ("│", "bold")
    text = Text()
    for char, style in cells:
        text.append(char, style=style)
    return text


def bars(est: Estimate) -> Table:
    """The stacked bars of every row against the GPU's memory."""
    top = max([row.total for row in est.rows] + [est.request.gpu_memory or 0])
    if est.request.gpu_memory:  # keep the GPU's line in view: clip bars beyond twice its memory
        top = min(top, 2 * est.request.gpu_memory)
    scale = top / BAR_WIDTH
    grid = Table.grid(padding=(0, 1))
    grid.add_column()
    grid.add_column()
    grid.add_column(justify="right")
    for row in est.rows:
        name = f"{row.placement.stage} {row.placement.offload_label}".replace(" -", "")
        grid.add_row(name, bar(row, scale, est.request.gpu_memory), f"{gib(row.total):.1f} GiB")
    return grid


def legend(est: Estimate) -> Text:
    """What each bar character stands for."""
    text = Text()
    for _, (name, char, colour) in TERMS.items():
        text.append(f"{char} {name}  ", style=colour)
    if est.request.gpu_memory is not None:
        text.append(f"│ GPU memory {gib(est.request.gpu_memory):.1f} GiB", style="bold")
    return text


def print_estimate(est: Estimate, console: Console, notes: list[str]) -> None:
    """Table, recommendation, bars and notes, in that order."""
    console.print(estimate_table(est))
    rec = est.recommendation
    if rec.row is not None:
        console.print(f"[bold green]recommended:[/] {rec.reason}", soft_wrap=True)
    else:
        console.print(f"[bold yellow]no recommendation:[/] {rec.reason}", soft_wrap=True)
    console.print(bars(est))
    console.print(legend(est))
    for note in notes:
        console.print(f"[dim]note: {note}[/]")
