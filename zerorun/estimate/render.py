"""The terminal view of an estimate: a table per variant, stacked bars, the recommendation.

Imported only by the CLI layer (it needs rich); the model itself stays terminal-free.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zerorun.estimate.counts import gib
from zerorun.estimate.memory_model import FIT_HEADROOM, Estimate, Row, usable_bytes
from zerorun.estimate.model_states import Offload, Placement, paper_reference
from zerorun.estimate.per_param import table as per_param_table

# term -> (column header, bar character, colour); distinct characters keep the bars readable without colour
TERMS: dict[str, tuple[str, str, str]] = {
    "params": ("params", "█", "blue"),
    "gradients": ("grads", "▓", "green"),
    "optimizer_states": ("optim", "▒", "yellow"),
    "grad_accum": ("f32grad", "░", "dark_orange"),
    "buffers": ("buf", "≡", "magenta"),
    "in_flight": ("flight", "~", "cyan"),
    "activations": ("activ", "#", "red"),
    "overhead": ("overhead", "·", "grey50"),
}
TABLE_TERMS = [t for t in TERMS if t != "overhead"]  # the same for every row: said in the caption
BAR_WIDTH = 44


def _fmt(n_bytes: int) -> str:
    return "-" if n_bytes == 0 else f"{gib(n_bytes):.1f}"


def _fits(row: Row) -> Text:
    if row.fits is None:
        return Text("?", style="dim")
    return Text("yes", style="green") if row.fits else Text("no", style="red")


def _offload(placement: Placement) -> str:
    """``-``, ``opt:cpu``, ``opt+par:cpu`` (both on one device) or ``opt:cpu par:nvme``: short for 80 columns."""
    opt, par = placement.offload_optimizer, placement.offload_param
    if opt is par and opt is not Offload.NONE:
        return f"opt+par:{opt.value}"
    return placement.offload_label


def assumptions_line(est: Estimate) -> str:
    """What the activation column assumed, or why there is none."""
    facts = est.assumptions()
    if facts is None:
        return "activations: not counted (give --model config.json, or --hidden/--layers/--heads)"
    shape = est.request.shape
    source = "" if shape is None or shape.seq_source == "--seq-len" else f" ({shape.seq_source})"
    policy = [name for name, on in (("activation checkpointing", facts["activation_checkpointing"]),
                                    ("flash attention", facts["flash_attention"])) if on]
    return (f"activations: sequence length {facts['seq_len']}{source} x micro batch {facts['micro_batch']} "
            f"per GPU, {', '.join(policy) or 'no checkpointing, no flash attention'}")


def reference_line(est: Estimate) -> str:
    """The paper's arithmetic per stage, labelled as a reference."""
    reference = paper_reference(est.request.training)
    cells = ", ".join(f"stage {stage} {gib(value):.1f}" for stage, value in reference.items())
    return f"reference, ZeRO paper (model states, 16-bit gradients): {cells} GiB"


def per_param_lines(est: Estimate) -> list[str]:
    """Model-state bytes per parameter of each master mode at each stage; the estimated one marked."""
    t = est.request.training
    lines = []
    for masters, rows in per_param_table(t.dtype, t.optimizer).items():
        cells = ", ".join(f"stage {p.stage} {p.formula()}" for p in rows)
        mark = " (this estimate)" if masters is t.masters else ""
        lines.append(f"bytes per parameter, {masters.value} masters{mark}: {cells}")
    return lines


BUFFER_NAMES = {"reduce_staging": "gradient staging", "gathered_params": "gathered window (prefetch included)",
                "unit_gradients": "a unit's gradient in hand", "persistent_params": "persistent parameters",
                "hpz_secondary": "hpZ secondary copy", "qwz_scratch": "qwZ int8 gathers",
                "qgz_scratch": "qgZ int8 reduce-scatter"}


def buffer_lines(est: Estimate) -> list[str]:
    """Every buffer the engine holds beside the model states (the table's ``buf``), in MiB: one line per
    set of buffers, naming the stages that hold it (and the offload only where a stage's rows differ)."""
    groups: dict[tuple[tuple[str, int], ...], list[tuple[int, str]]] = {}
    for row in est.rows:
        detail = tuple((k, v) for k, v in row.buffer_detail.items() if v)
        where = (row.placement.stage, _offload(row.placement))
        if detail and where not in groups.setdefault(detail, []):
            groups[detail].append(where)
    split = {stage for stage in {s for ws in groups.values() for s, _ in ws}
             if sum(any(s == stage for s, _ in ws) for ws in groups.values()) > 1}
    lines = []
    for detail, wheres in groups.items():
        labels = dict.fromkeys(f"{s} ({o if o not in ('', '-') else 'no offload'})" if s in split else str(s)
                               for s, o in wheres)
        cells = ", ".join(f"{BUFFER_NAMES.get(k, k)} {v / 2**20:,.1f}" for k, v in detail)
        lines.append(f"buffers, stage{'s' if len(labels) > 1 else ''} {', '.join(labels)} (MiB per GPU): {cells}")
    return lines


def estimate_table(est: Estimate) -> Table:
    """One row per stage/offload variant; every memory column in GiB (2^30 bytes).

    ``stage`` and ``fits`` never wrap or drop, even at 80 columns: the other
    columns are short numbers and the constant overhead is said in the caption.
    """
    r = est.request
    shown = [t for t in TABLE_TERMS if any(row.gpu[t] for row in est.rows)]
    any_nvme = any(row.nvme_per_node for row in est.rows)
    title = (
        f"{r.training.params:,} parameters ({r.training.params / 1e9:.2f}B), {r.training.dtype.value}, "
        f"{'' if not r.training.masters.low else r.training.masters.value + ' masters, '}"
        f"{r.training.optimizer.value}, {r.nodes} node(s) x {r.gpus_per_node} GPU(s) = {r.training.world_size}"
    )
    fit = "" if r.gpu_memory is None else f"; fits: within {gib(usable_bytes(r.gpu_memory)):.1f} GiB " \
        f"({1 - FIT_HEADROOM:.0%} of {gib(r.gpu_memory):.1f})"
    table = Table(
        title=title,
        caption=f"GiB (2^30 bytes) per GPU incl. {gib(r.overhead):.1f} overhead, CPU per node; "
        f"* = recommended{fit}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 0),
    )
    table.add_column("stage", justify="center", no_wrap=True, min_width=5)
    table.add_column("offload", no_wrap=True)
    for t in shown:
        table.add_column(TERMS[t][0], justify="right", no_wrap=True)
    table.add_column("total", justify="right", style="bold", no_wrap=True, min_width=5)
    table.add_column("CPU", justify="right", no_wrap=True)
    if any_nvme:
        table.add_column("NVMe", justify="right", no_wrap=True)
    table.add_column("fits", justify="center", no_wrap=True, min_width=4)
    for row in est.rows:
        best = est.recommendation.row is row
        style = "bold" if best else ""
        cells = [Text(f"{row.placement.stage}{' *' if best else ''}", style=style), Text(_offload(row.placement), style=style)]
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


def print_estimate(est: Estimate, console: Console, notes: list[str], config: str | None = None) -> None:
    """Table, recommendation, levers, bars and notes, in that order (``config``: the estimate's ``--config``)."""
    console.print(estimate_table(est))
    rec = est.recommendation
    from zerorun.estimate.levers import advice, next_command, next_note

    if rec.row is not None:
        console.print(f"[bold green]recommended:[/] {rec.reason}", soft_wrap=True)
        command = next_command(est, config)
        if command:
            console.print("[bold green]next:[/] ", end="", soft_wrap=True)
            console.print(command, soft_wrap=True, markup=False, highlight=False)
        note = next_note(est)
        if note:
            console.print(f"      {note}", soft_wrap=True, markup=False, style="dim")
    else:
        console.print(f"[bold yellow]no recommendation:[/] {rec.reason}", soft_wrap=True)
    hint = advice(est)
    if hint:
        console.print(hint, soft_wrap=True, markup=False, style="bold cyan")
    console.print(assumptions_line(est), soft_wrap=True, markup=False)
    console.print(f"[dim]{reference_line(est)}[/]", soft_wrap=True)
    for line in per_param_lines(est):
        console.print(line, soft_wrap=True, markup=False, style="dim")
    for line in buffer_lines(est):
        console.print(line, soft_wrap=True, markup=False, style="dim")
    console.print(bars(est))
    console.print(legend(est))
    for note in notes:
        console.print(f"[dim]note: {note}[/]")
