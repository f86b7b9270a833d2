"""DeepSpeed's Adam classes on a torch whose Adam has no ``decoupled_weight_decay`` (before 2.7): the
decay is applied before Adam's update, as torch's AdamW does; the same steps as AdamW."""

from __future__ import annotations

import pytest
import torch

from zerorun.compat import optimizers


@pytest.mark.parametrize("name", ["FusedAdam", "DeepSpeedCPUAdam"])
def test_adamw_mode_without_decoupled_weight_decay_steps_as_adamw(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(optimizers, "_ADAM_DECOUPLES", False)  # what torch < 2.7 offers
    torch.manual_seed(0)
    ours, ref = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    ref.load_state_dict(ours.state_dict())
    opt = getattr(optimizers, name)(ours.parameters(), lr=0.01, weight_decay=0.1)
    want = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    for step in range(4):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        for model, o in ((ours, opt), (ref, want)):
            o.zero_grad()
            model(x).pow(2).mean().backward()
            o.step()
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1]  # the group still says its decay
    # the L2 form (adam_w_mode False) differs: the decay is in the gradient, not applied after
    l2 = torch.nn.Linear(8, 4)
    l2.load_state_dict(ref.state_dict())
    assert not getattr(optimizers, name)(l2.parameters(), lr=0.01, weight_decay=0.1, **{
        "adam_w_mode" if name == "FusedAdam" else "adamw_mode": False}).adam_w_mode
