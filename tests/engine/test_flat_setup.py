"""Stages 0-2 set up bucket by bucket (zerorun.engine.flat_setup), and one GPU takes the NCCL policy.

The device is the simulated world's ``meta`` (torch's fake group, nothing allocated: 1.5B
parameters set up in a second), pinned host memory the deferred-copy stand-in's, both
counted by :class:`tests.engine.setup_ledger.Ledger` from every op's outputs. The bound is
the issue's: the set-up's device peak is at most the model in the compute dtype (bf16) plus
one fp32 bucket, plus the masters that live on the device anyway (none with
``offload_optimizer``: they never get a device allocation). 9b6a4ae moved the model whole in
fp32, then made every bucket, then cloned the masters on the device: about 4 + 4 + 4/N bytes
per parameter against the bound's 2.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
import torch
from torch import nn

import zerorun
from tests.engine.setup_ledger import Ledger
from zerorun.engine import build, flat_setup
from zerorun.engine.offload import copy_checks

WORLD = 8
BUCKET = 50_000_000  # elements: a common production reduce_bucket_size


def _model(layers: int, width: int) -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def _setup_peak(stage: int, offload: bool, layers: int = 90, width: int = 4096) -> dict[str, Any]:
    """Set up a ``layers`` x Linear(width, width) model (90 x 4096: 1.51B parameters) as rank 0 of 8."""
    model = _model(layers, width)
    zero: dict[str, Any] = {"stage": stage, "reduce_bucket_size": BUCKET}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    ledger = Ledger("meta", lambda: copy_checks.stream().allocating_host)
    ledger.ignore([p for p in model.parameters()])
    phase: dict[str, int] = {}

    def buckets_then_note_the_peak(*args: Any) -> Any:  # the parameters' phase ends here
        out = flat_setup.streamed_buckets(*args)
        phase["peak"] = ledger.peak["device"]
        return out

    with zerorun.simulate.world(WORLD, rank=0, device="meta"), ledger, \
            patch.object(build, "streamed_buckets", buckets_then_note_the_peak):
        engine, *_ = zerorun.initialize(model=model, config=cfg)
        psi = engine.num_parameters()
        largest = max(b.plan.padded_numel for b in engine.parts.buckets)
        masters = engine.parts.masters.masters
        on_device = sum(m.numel() * 4 for m in masters if m.device.type == "meta" and not
                        copy_checks.stream().is_pinned(m))
    return {"psi": psi, "largest": largest, "peak": ledger.peak["device"], "pinned_peak": ledger.peak["pinned"],
            "device_masters": on_device, "pinned_now": ledger.now["pinned"], "end": ledger.now["device"],
            "params_phase_peak": phase["peak"]}


def _check_bound(r: dict[str, Any]) -> None:
    """While the parameters are set up: at most the bf16 model + one fp32 bucket + the device masters;
    over the whole set-up: that, or the steady state the stage holds after it (its gradient buffers
    are made after the parameters), whichever is larger."""
    transient = 2 * r["psi"] + 4 * r["largest"] + r["device_masters"]
    assert r["params_phase_peak"] <= transient, (r["params_phase_peak"], transient)
    bound = max(transient, r["end"])
    assert r["peak"] <= bound, (f"set-up peak {r['peak'] / 2**30:.3f} GiB > bound {bound / 2**30:.3f} GiB "
                                f"(transient {transient / 2**30:.3f}, after set-up {r['end'] / 2**30:.3f})")


@pytest.fixture(autouse=True)
def _stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(copy_checks.CHECK_ENV, "deferred")  # "pinned" host buffers made on meta, counted apart
    monkeypatch.setattr(copy_checks, "_STREAM", [])


@pytest.mark.parametrize("stage,layers", [(2, 90), (1, 12)], ids=["stage2-1.5B", "stage1-0.2B"])
def test_set_up_with_offload_holds_the_bf16_model_and_one_fp32_bucket(stage: int, layers: int) -> None:
    r = _setup_peak(stage, offload=True, layers=layers)
    assert r["psi"] > layers * 4096**2 and r["device_masters"] == 0  # the masters never touch the device
    _check_bound(r)
    # pinned host: exactly this rank's fp32 masters and its fp32 gradient sums, where reductions land during
    # backward (4 bytes x psi / 8 each, padding included)
    held = 2 * 4 * r["psi"] / WORLD
    assert r["pinned_now"] == r["pinned_peak"] and abs(r["pinned_now"] - held) < 2 * 4 * r["largest"]


@pytest.mark.parametrize("stage", [0, 2])
def test_set_up_without_offload_adds_only_the_device_masters(stage: int) -> None:
    r = _setup_peak(stage, offload=False, layers=12, width=1024)
    assert r["device_masters"] > 0
    _check_bound(r)


def test_one_process_takes_the_policy_of_its_backend() -> None:
    """At world 1 the engine's collectives get the bootstrap's group: its backend decides the layout.
    On the fake group (native collectives, as NCCL) a 2^21+-element model is one bucket at the
    configured size; 9b6a4ae gave world 1 no group, hence gloo's policy (2^21-element buckets)."""
    model = _model(3, 1024)  # 3.1M parameters
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 10**8},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    with zerorun.simulate.world(1, rank=0, device="meta"):
        engine, *_ = zerorun.initialize(model=model, config=cfg)
        assert engine.coll.group is not None and engine.coll.native_reduce_scatter
        assert len(engine.parts.buckets) == 1
