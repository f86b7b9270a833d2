"""Shared model, data, cases and reference training for the engine tests (no tests here; imported by spawned ranks too).

The model has odd shapes (padding at every world size), a LayerNorm and a parameter
that is unused in forward (its bucket must still be reduced).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

IN, HID, OUT = 7, 15, 9
MICRO_BATCH = 4
STEPS = 5
LR = 1e-2
SGD_LR = 5e-2


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, HID)
        self.norm = nn.LayerNorm(HID)
        self.fc2 = nn.Linear(HID, HID)
        self.head = nn.Linear(HID, OUT)
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.norm(self.fc1(x)))
        return self.head(h + torch.tanh(self.fc2(h)))


def make_model(seed: int = 1234) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def global_batch(step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(rows, IN, generator=g)
    y = torch.randn(rows, OUT, generator=g)
    return x, y


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out.float(), y)


@dataclass(frozen=True)
class Case:
    stage: int
    dtype: str  # "fp32" | "bf16"
    gas: int
    clip: float
    overlap: bool = False
    optimizer: str = "AdamW"  # SGD too: Adam's scale invariance would hide gradient-scaling bugs
    bucket: int = 60
    comm_dtype: str | None = None  # communication_data_type
    predivide: float | None = None  # prescale_gradients with this gradient_predivide_factor

    @property
    def lr(self) -> float:
        return LR if self.optimizer == "AdamW" else SGD_LR

    def optimizer_block(self) -> dict:
        if self.optimizer == "AdamW":
            return {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}}
        return {"type": "SGD", "params": {"lr": SGD_LR, "momentum": 0.9}}

    def make_reference_optimizer(self, params: list) -> torch.optim.Optimizer:
        if self.optimizer == "AdamW":
            return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
        return torch.optim.SGD(params, lr=SGD_LR, momentum=0.9)

    @property
    def name(self) -> str:
        extra = (f"-comm{self.comm_dtype}" if self.comm_dtype else "") + (
            f"-predivide{self.predivide}" if self.predivide else "")
        return (f"stage{self.stage}-{self.dtype}-gas{self.gas}-clip{self.clip}-{self.optimizer}"
                f"-overlap{int(self.overlap)}{extra}")

    def config(self) -> dict:
        cfg: dict = {
            "train_micro_batch_size_per_gpu": MICRO_BATCH,
            "gradient_accumulation_steps": self.gas,
            "gradient_clipping": self.clip,
            "steps_per_print": 10**6,
            "optimizer": self.optimizer_block(),
            "zero_optimization": {"stage": self.stage, "reduce_bucket_size": self.bucket,
                                  "overlap_comm": self.overlap},
        }
        if self.dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        if self.comm_dtype:
            cfg["communication_data_type"] = self.comm_dtype
        if self.predivide:
            cfg.update(prescale_gradients=True, gradient_predivide_factor=self.predivide)
        return cfg


def all_cases() -> list[Case]:
    cases = []
    for stage in (0, 1, 2):
        for dtype in ("fp32", "bf16"):
            for gas in (1, 3):
                for clip in (0.0, 0.05):
                    sgd = (gas == 3) != (clip > 0)
                    cases.append(Case(stage, dtype, gas, clip, overlap=(gas == 3) == (dtype == "bf16"),
                                      optimizer="SGD" if sgd else "AdamW"))
    cases.append(Case(1, "bf16", 1, 0.0, overlap=True, optimizer="SGD", comm_dtype="fp32"))
    cases.append(Case(2, "fp32", 3, 0.05, overlap=True, optimizer="SGD", predivide=2.0))
    return cases


def rank_rows(step_micro: int, rank: int, world: int) -> slice:
    start = (step_micro * world + rank) * MICRO_BATCH
    return slice(start, start + MICRO_BATCH)


def master_step(params: list[torch.Tensor], compute: nn.Module, opt: torch.optim.Optimizer, clip: float = 0.0) -> None:
    """One reference step over fp32 masters: the compute copy's gradients (zero where none), clip, step, copy back."""
    for p, c in zip(params, compute.parameters(), strict=True):
        p.grad = torch.zeros_like(p) if c.grad is None else c.grad.float()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    with torch.no_grad():
        for p, c in zip(params, compute.parameters(), strict=True):
            c.copy_(p)


def reference(case: Case, world: int) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the same global batch: fp32 master weights, compute in ``case.dtype``."""
    master = make_model()
    compute = copy.deepcopy(master).to(torch.bfloat16 if case.dtype == "bf16" else torch.float32)
    params = [p for p in master.parameters()]
    opt = case.make_reference_optimizer(params)
    rows = MICRO_BATCH * world * case.gas
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, rows)
        out = compute(x.to(next(compute.parameters()).dtype))
        loss = loss_fn(out, y)
        compute.zero_grad(set_to_none=True)
        loss.backward()
        losses.append(float(loss.detach()))
        master_step(params, compute, opt, case.clip)
    return losses, [p.detach().clone() for p in master.parameters()]


def train_case(case: Case, rank: int, world: int) -> dict:
    """What one rank sees training ``case`` with the engine."""
    import zerorun

    model = make_model()
    engine, _, _, _ = zerorun.initialize(model=model, config=case.config())
    rows = MICRO_BATCH * world * case.gas
    micro_losses = []
    comm_per_step = []
    for step in range(STEPS):
        x, y = global_batch(step, rows)
        before = engine.comm_stats()
        step_losses = []
        for k in range(case.gas):
            sl = rank_rows(k, rank, world)
            loss = loss_fn(engine(x[sl].to(engine.precision.compute_dtype)), y[sl])
            engine.backward(loss)
            engine.step()
            step_losses.append(float(loss))
        after = engine.comm_stats()
        comm_per_step.append({kind: after[kind]["elements"] - before[kind]["elements"] for kind in after})
        micro_losses.append(step_losses)
    masters = [m.detach().clone() for m in engine.parts.masters.masters]
    return {
        "losses": micro_losses,
        "params": [p.detach().float().clone() for p in model.parameters()],
        "masters": masters,
        "global_steps": engine.global_steps,
        "memory": engine.memory_breakdown(),
        "comm_per_step": comm_per_step,
        "numel": engine.num_parameters(),
        "padded": sum(b.plan.padded_numel for b in engine.parts.buckets),
        "buckets": len(engine.parts.buckets),
        "max_bucket": max(b.plan.padded_numel for b in engine.parts.buckets),
        "via": engine.comm_stats()["reduce_scatter"].get("via", ""),
    }
