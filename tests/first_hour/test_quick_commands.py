"""Quick small commands: validate, print-config and estimate never import torch or the engine
(torch's import alone is 1-4 s on a shared 2-core machine; validate imported it for the optimizer's
signature and took 7 s). The signature table they use instead is the real classes'."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from zerorun.config import builder_signatures
from zerorun.engine.training.optim_factory import _CLASSES, _DROPPED
from zerorun.engine.training.schedulers import _SCHEDULES

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import sys; from zerorun.cli import main; main(sys.argv[1:]); "
         "print('HEAVY', sorted(m for m in ('torch', 'zerorun.engine') if m in sys.modules))")


@pytest.mark.parametrize("argv", [
    ["validate", "templates/zero2.yaml", "templates/zero3-offload-nvme.yaml"],
    ["print-config", "templates/zero2.yaml", "--docs"],
    ["estimate", "--params", "14B", "--gpus", "8", "--gpu-memory", "80GB"],
], ids=lambda argv: argv[0])
def test_small_commands_do_not_import_torch(argv: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]


def test_the_signature_table_is_the_real_classes() -> None:
    optimizers = {name: (cls.__name__, {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                                        if k not in ("self", "params")}) for name, cls in _CLASSES.items()}
    schedules = {name: {f.name: None if f.default is dataclasses.MISSING else f.default
                        for f in dataclasses.fields(cls)} for name, cls in _SCHEDULES.items()}
    assert optimizers == builder_signatures.OPTIMIZERS  # a torch upgrade that changed one: rewrite the table
    assert schedules == builder_signatures.SCHEDULES
    assert _DROPPED == builder_signatures.DROPPED
