"""Models, data, cases and the single-process reference for the stage-3 tests (no tests here; spawned ranks import it).

Models: the toy MLP of the stage 0-2 tests (odd shapes, a LayerNorm, a root parameter
unused in forward), the tiny GPT of ``examples/train_gpt.py`` (tied input/output
embeddings: one parameter used by two units; ``nn.MultiheadAttention``, whose forward
reads ``out_proj.weight`` without calling ``out_proj``), the same GPT with activation
checkpointing on its blocks, and an MLP whose middle unit is skipped on some steps
(data-dependent control flow; the branch is the same on every rank, as collectives
require).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from examples.train_gpt import TinyGPT
from tests.engine.test_engine_cases import IN, OUT, Tiny, master_step, rank_rows

MICRO_BATCH = 4
STEPS = 3
LR, SGD_LR = 1e-2, 5e-2
VOCAB, BLOCK, DIM = 13, 8, 16
LARGE = 10**9


class CkptGPT(TinyGPT):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.lm_head(self.ln_f(x))


class Branchy(Tiny):
    """``fc2`` runs only when ``skip`` is False (set per step, identically on every rank)."""

    skip = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.norm(self.fc1(x)))
        return self.head(h if self.skip else h + torch.tanh(self.fc2(h)))


class Deep(nn.Module):
    """Many equal units (16 Linear(32, 32)): the memory test's window is a few of them."""

    def __init__(self, layers: int = 16, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.layers:
            x = x + torch.tanh(lin(x))
        return x


def _floats_in(engine: object, x: torch.Tensor) -> torch.Tensor:
    """Floating inputs in the compute dtype (the engine casts none); token ids stay as they are."""
    return x.to(engine.precision.compute_dtype) if x.is_floating_point() else x  # type: ignore[attr-defined]


def make_model(kind: str, seed: int = 1234) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        return Tiny()
    if kind == "branch":
        return Branchy()
    if kind == "deep":
        return Deep()
    cls = CkptGPT if kind == "gpt-ckpt" else TinyGPT
    return cls(VOCAB, BLOCK, DIM, 1, 2)  # one block: tied embeddings, attention, MLP; half the units of two


def is_gpt(kind: str) -> bool:
    return kind.startswith("gpt")


def global_batch(kind: str, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + step)
    if is_gpt(kind):
        idx = torch.randint(0, VOCAB, (rows, BLOCK + 1), generator=g)
        return idx[:, :-1], idx[:, 1:]
    width = 32 if kind == "deep" else IN
    x = torch.randn(rows, width, generator=g)
    return x, torch.randn(rows, 32 if kind == "deep" else OUT, generator=g)


def loss_fn(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if is_gpt(kind):
        return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.mse_loss(out.float(), y)


def before_step(kind: str, model: nn.Module, step: int) -> None:
    if kind == "branch":
        model.skip = step % 3 == 1  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Case:
    model: str
    dtype: str
    gas: int
    prefetch: bool
    persist: bool
    sgd: bool = False
    reuse: int = 0  # stage3_max_reuse_distance

    @property
    def name(self) -> str:
        return (f"{self.model}-{self.dtype}-gas{self.gas}-prefetch{int(self.prefetch)}-persist{int(self.persist)}"
                f"-{'SGD' if self.sgd else 'AdamW'}-reuse{self.reuse}")

    @property
    def lr(self) -> float:
        return SGD_LR if self.sgd else LR

    def make_reference_optimizer(self, params: list) -> torch.optim.Optimizer:
        if self.sgd:
            return torch.optim.SGD(params, lr=SGD_LR, momentum=0.9)
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)

    def config(self) -> dict:
        opt = ({"type": "SGD", "params": {"lr": SGD_LR, "momentum": 0.9}} if self.sgd
               else {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}})
        cfg: dict = {
            "train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": self.gas,
            "steps_per_print": 10**6, "optimizer": opt,
            "gradient_clipping": 0.0,  # the reference does not clip (DeepSpeed's default would be 1.0)
            "zero_optimization": {
                "stage": 3, "overlap_comm": self.gas == 1,
                # a window of a few hundred elements: several units ahead, never the whole model
                "stage3_prefetch_bucket_size": 400 if self.prefetch else 0,
                "stage3_max_live_parameters": 2000 if self.prefetch else LARGE,
                "stage3_max_reuse_distance": self.reuse,
                # "large": every unit of these models stays gathered; 0: none does
                "stage3_param_persistence_threshold": LARGE if self.persist else 0,
                "stage3_gather_16bit_weights_on_model_save": True,
            },
        }
        if self.dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        return cfg


def parity_cases() -> list[Case]:
    cases = []
    for model in ("mlp", "gpt"):
        for dtype in ("fp32", "bf16"):
            for gas in (1, 3):
                for prefetch in (False, True):
                    for persist in (False, True):
                        # the GPT steps SGD: AdamW divides by sqrt(v), so a gradient that is zero up to
                        # rounding (the attention key bias: softmax ignores it) moves by a full lr in a
                        # direction set by summation order - not a property of the engine
                        sgd = model == "gpt" or (gas == 3) == persist
                        cases.append(Case(model, dtype, gas, prefetch, persist, sgd=sgd,
                                          reuse=LARGE if prefetch and gas == 1 else 0))
    cases += [Case("gpt-ckpt", "fp32", 1, False, False, sgd=True), Case("gpt-ckpt", "bf16", 3, True, False, sgd=True),
              Case("branch", "fp32", 1, True, False), Case("branch", "fp32", 3, False, False, sgd=True)]
    return cases


def reference(case: Case, world: int) -> tuple[list[float], list[torch.Tensor]]:
    """Single-process training on the global batch: fp32 masters, compute in ``case.dtype``."""
    master = make_model(case.model)
    compute = copy.deepcopy(master).to(torch.bfloat16 if case.dtype == "bf16" else torch.float32)
    params = list(master.parameters())
    opt = case.make_reference_optimizer(params)
    rows = MICRO_BATCH * world * case.gas
    losses = []
    for step in range(STEPS):
        before_step(case.model, compute, step)
        x, y = global_batch(case.model, step, rows)
        x = x if is_gpt(case.model) else x.to(next(compute.parameters()).dtype)
        loss = loss_fn(case.model, compute(x), y)
        compute.zero_grad(set_to_none=True)
        loss.backward()
        losses.append(float(loss.detach()))
        master_step(params, compute, opt)
    return losses, [p.detach().clone() for p in master.parameters()]


def train_case(case: Case, rank: int, world: int, model: nn.Module | None = None,
               config: dict | None = None) -> dict:
    """What one rank sees training ``case`` with the engine (``model``: e.g. one built under zero.Init)."""
    import zerorun

    model = make_model(case.model) if model is None else model
    engine, _, _, _ = zerorun.initialize(model=model, config=config or case.config())
    coord = engine.parts.coordinator
    rows = MICRO_BATCH * world * case.gas
    micro_losses, comm_per_step = [], []
    for step in range(STEPS):
        before_step(case.model, model, step)
        x, y = global_batch(case.model, step, rows)
        before = engine.comm_stats()
        step_losses = []
        for k in range(case.gas):
            sl = rank_rows(k, rank, world)
            loss = loss_fn(case.model, engine(_floats_in(engine, x[sl])), y[sl])
            engine.backward(loss)
            engine.step()
            step_losses.append(float(loss.detach()))
        after = engine.comm_stats()
        comm_per_step.append({kind: after[kind]["elements"] - before[kind]["elements"] for kind in after})
        micro_losses.append(step_losses)
    memory = engine.memory_breakdown()
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        params = [p.detach().float().clone() for p in model.parameters()]
    buckets = engine.parts.buckets
    return {
        "losses": micro_losses, "params": params, "global_steps": engine.global_steps,
        "memory": memory, "comm_per_step": comm_per_step, "numel": engine.num_parameters(),
        "padded": sum(b.plan.padded_numel for b in buckets),
        "persistent_padded": sum(b.plan.padded_numel for b in buckets if b.persistent),
        "tied_padded": sum(buckets[u.buckets[0]].plan.padded_numel for u in engine.parts.units
                           if u.name == "lm_head"),
        "n_buckets": len(buckets), "n_slots": sum(len(b.plan.slots) for b in buckets), "max_bucket": max(b.plan.padded_numel for b in buckets),
        "fallbacks": coord.stats.fallbacks, "prefetched": coord.stats.prefetched,
        "states_after": sorted({b.state.value for b in buckets if not b.persistent}),
    }
