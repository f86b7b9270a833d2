"""Quick small commands: validate, print-config and estimate never import torch or the engine
(torch's import alone is 1-4 s on a shared 2-core machine; validate imported it for the optimizer's
signature and took 7 s), and convert imports torch but not its compiler. The signature table
they use instead of torch is the real classes'."""

from __future__ import annotations

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


def test_convert_imports_torch_but_not_the_compiler(tmp_path: Path) -> None:
    """convert needs torch to read the shards, not torch._dynamo: the collectives' and the parameter
    attributes' compile markers imported it at import time (2-3x torch's own import; 11-13 s in all)."""
    probe = ("import sys; from zerorun.cli import main; main(sys.argv[1:]); "
             "print('LOADED', sorted(m for m in ('torch', 'zerorun.engine.checkpoint.load', 'torch._dynamo') "
             "if m in sys.modules))")
    argv = ["convert", str(tmp_path / "no-checkpoint"), str(tmp_path / "out.pt")]
    out = subprocess.run([sys.executable, "-c", probe, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "LOADED ['torch', 'zerorun.engine.checkpoint.load']" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]


def test_the_signature_table_is_the_real_classes() -> None:
    optimizers = {name: (cls.__name__, {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                                        if k not in ("self", "params")}) for name, cls in _CLASSES.items()}
    schedules = {name: {k: None if p.default is inspect.Parameter.empty else p.default
                        for k, p in inspect.signature(cls.__init__).parameters.items()
                        if k not in ("self", "optimizer", "last_batch_iteration")} for name, cls in _SCHEDULES.items()}
    assert optimizers == builder_signatures.OPTIMIZERS  # a torch upgrade that changed one: rewrite the table
    assert schedules == builder_signatures.SCHEDULES
    assert _DROPPED == builder_signatures.DROPPED
