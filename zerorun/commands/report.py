"""`zerorun report`: the environment report (like DeepSpeed's ds_report)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import typer

SHM_MIN_BYTES = 1 << 30
"""Below this, /dev/shm is too small for DataLoader workers and NCCL (Docker's default is 64 MiB)."""

GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_gib: float
    memory_used_gib: float


@dataclass
class Report:
    """Everything the report shows; ``warnings`` are things to fix before training."""

    python: str
    platform: str
    zerorun: str
    torch: str
    torch_cuda: str | None
    cuda_available: bool
    nccl: str | None
    backends: dict[str, bool]
    gpu_driver: str | None
    gpus: list[Gpu]
    gpu_note: str
    cpu_physical: int | None
    cpu_logical: int | None
    memory_total_gib: float
    memory_available_gib: float
    shm_total_gib: float | None
    launchers: dict[str, str | None]
    warnings: list[str] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpus(nvml: Any) -> tuple[str | None, list[Gpu], str]:
    """GPUs through NVML (``pynvml``): (driver version, GPUs, a note when there are none)."""
    try:
        nvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, [], f"no GPU (NVML unavailable: {err})"
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = _text(nvml.nvmlDeviceGetName(handle))
            gpus.append(Gpu(index, name, round(memory.total / GIB, 1), round(memory.used / GIB, 1)))
        return driver, gpus, "" if gpus else "no GPU (NVML sees 0 devices)"
    finally:
        nvml.nvmlShutdown()


def _torch_facts() -> tuple[str, str | None, bool, str | None, dict[str, bool]]:
    import torch
    import torch.distributed as dist

    nccl = None
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # NCCL missing from this build
            nccl = None
    backends = {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "mpi": dist.is_available() and dist.is_mpi_available(),
    }
    return torch.__version__, torch.version.cuda, torch.cuda.is_available(), nccl, backends


def collect(nvml: Any | None = None) -> Report:
    """Gather the report; ``nvml`` defaults to the real ``pynvml`` module."""
    import psutil

    from zerorun import __version__

    if nvml is None:
        import pynvml as nvml
    torch_version, torch_cuda, cuda_ok, nccl, backends = _torch_facts()
    driver, gpus, gpu_note = probe_gpus(nvml)
    memory = psutil.virtual_memory()
    shm = shutil.disk_usage("/dev/shm").total / GIB if os.path.isdir("/dev/shm") else None
    report = Report(
        python=sys.version.split()[0],
        platform=platform.platform(),
        zerorun=__version__,
        torch=torch_version,
        torch_cuda=torch_cuda,
        cuda_available=cuda_ok,
        nccl=nccl,
        backends=backends,
        gpu_driver=driver,
        gpus=gpus,
        gpu_note=gpu_note,
        cpu_physical=psutil.cpu_count(logical=False),
        cpu_logical=psutil.cpu_count(logical=True),
        memory_total_gib=round(memory.total / GIB, 1),
        memory_available_gib=round(memory.available / GIB, 1),
        shm_total_gib=None if shm is None else round(shm, 2),
        launchers={name: shutil.which(name) for name in ("ssh", "pdsh", "srun", "mpirun")},
    )
    report.warnings = check(report)
    return report


def check(report: Report) -> list[str]:
    """Things in the environment that will bite during training."""
    found = []
    if report.shm_total_gib is not None and report.shm_total_gib * GIB < SHM_MIN_BYTES:
        found.append(
            f"/dev/shm is only {report.shm_total_gib:.2f} GiB; DataLoader workers and NCCL need more "
            "(docker run --shm-size=8g, or --ipc=host)"
        )
    if report.shm_total_gib is None:
        found.append("/dev/shm is missing; multi-process data loading will fail")
    if report.gpus and not report.cuda_available:
        found.append(
            f"NVML sees {len(report.gpus)} GPU(s) but torch has no CUDA: install a CUDA build of torch"
        )
    if report.cuda_available and not report.backends.get("nccl"):
        found.append("CUDA is available but NCCL is not; multi-GPU training falls back to gloo (slow)")
    if not report.backends.get("gloo"):
        found.append("torch.distributed has no gloo backend; CPU ranks cannot communicate")
    return found


def _print(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    from zerorun.commands.console import console as make_console

    yes = lambda ok: "[green]yes[/]" if ok else "[red]no[/]"  # noqa: E731
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("python", f"{report.python} ({report.platform})"),
        ("zerorun", report.zerorun),
        ("torch", f"{report.torch} (CUDA build: {report.torch_cuda or 'none'})"),
        ("cuda available", yes(report.cuda_available)),
        ("nccl version", report.nccl or "-"),
        *((f"backend {name}", yes(ok)) for name, ok in report.backends.items()),
        ("gpu driver", report.gpu_driver or "-"),
        *(
            (f"gpu {g.index}", f"{g.name}, {g.memory_total_gib} GiB ({g.memory_used_gib} GiB used)")
            for g in report.gpus
        ),
        *((("gpus", report.gpu_note),) if not report.gpus else ()),
        ("cpu cores", f"{report.cpu_physical} physical, {report.cpu_logical} logical"),
        ("memory", f"{report.memory_total_gib} GiB ({report.memory_available_gib} GiB available)"),
        ("/dev/shm", "-" if report.shm_total_gib is None else f"{report.shm_total_gib} GiB"),
        *((f"launcher {name}", path or "[dim]not found[/]") for name, path in report.launchers.items()),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console = make_console()
    console.print(table)
    for warning in report.warnings:
        Console(stderr=True, highlight=False).print(f"[yellow]warning:[/] {warning}")


def command(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON (for bug reports and scripts).")
    ] = False,
) -> None:
    """Report the environment: python, torch, CUDA/NCCL, backends, GPUs, CPU, memory.

    GPUs are read through NVML (name, memory, driver); without one the report says
    "no GPU". Warnings (a small /dev/shm, GPUs without a CUDA build of torch, no
    NCCL) go to stderr. Paste the output into bug reports.

    Examples:

      zerorun report

      zerorun report --json > env.json
    """
    report = collect()
    if as_json:
        typer.echo(json.dumps(asdict(report), indent=2))
    else:
        _print(report)
