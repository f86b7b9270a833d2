"""Eager vs compiled training, each system in both forms, interleaved in one torchrun job.

    DS_ACCELERATOR=cpu PYTHONPATH=. /path/to/ds-venv/bin/python -m torch.distributed.run --standalone \\
        --nproc_per_node 2 bench/compile.py --steps 8 --backend inductor

Systems (``--systems``): zerorun-z0..z3 (``engine.compile(backend=)``: stages 0-2 the whole module in
place, stage 3 each block's forward as one gather unit), fsdp2 (``fully_shard`` per block and the root,
each block compiled in place first: torchtitan's per-block recipe; the root's own modules, the
embedding, final norm and tied head, stay eager as they do at zerorun's stage 3) and ds-z0..z3
(DeepSpeed's ``engine.compile(backend=)``, where ``deepspeed`` imports: DS_ACCELERATOR=cpu on CPU), and
torch (no engine and no communication: each rank steps its own replica, compiled whole: the ceiling).

Every arm builds the same GPT-shaped model (tied embeddings, pre-norm blocks of causal attention and
an MLP) from one seed, reads the same tokens and steps torch's AdamW. The first step of each arm runs
alone (the compile time is its first step minus the eager arm's); then step s of every arm runs before
step s+1 of any, so a load change on a shared machine hits all alike. Step time: the slowest rank's,
median over the steps after the second; ``paired``: the median of the per-step ratios compiled/eager
(steps run back to back, so it is the figure a varying load disturbs least). Losses: the compiled arm's against its eager arm's, every step.
Graphs, breaks and recompiles: dynamo's counters over the compiled arm's first two steps.
Rank 0 prints a table and one ``BENCH_COMPILE`` JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.compile_llama import Llama  # noqa: E402

Step = Callable[[torch.Tensor], float]
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.01


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.dim)
        self.pos = nn.Parameter(torch.zeros(a.seq, a.dim))
        self.blocks = nn.ModuleList(Block(a.dim, a.heads) for _ in range(a.layers))
        self.norm = nn.LayerNorm(a.dim)
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.emb.weight.t()  # the tied head


def loss_of(model: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def tokens_for(a: argparse.Namespace, step: int, rank: int, world: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step * world + rank)
    return torch.randint(0, a.vocab, (a.micro, a.seq + 1), generator=g)


def build(a: argparse.Namespace) -> nn.Module:
    torch.manual_seed(a.seed)
    if a.arch == "llama":
        return Llama(a)
    return Gpt(a)


def adamw(params: object) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)  # type: ignore[arg-type]


def engine_config(a: argparse.Namespace, stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": a.micro, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
            "steps_per_print": 10**9, "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": stage}}


def plain_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Step:
    """A step of ``model`` with ``opt`` and no engine (FSDP2's, and the torch-only arm's)."""
    def step(tokens: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, tokens)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def engine_step(engine: object) -> Step:
    def step(tokens: torch.Tensor) -> float:
        loss = loss_of(engine, tokens)  # type: ignore[arg-type]
        engine.backward(loss)  # type: ignore[attr-defined]
        engine.step()  # type: ignore[attr-defined]
        return loss.item()

    return step


def setup_zerorun(a: argparse.Namespace, stage: int, compiled: bool) -> Step:
    import zerorun

    model = build(a)
    engine, _, _, _ = zerorun.initialize(model=model, optimizer=adamw(model.parameters()),
                                         config=engine_config(a, stage))
    if compiled:
        engine.compile(backend=a.backend)
    return engine_step(engine)


def setup_deepspeed(a: argparse.Namespace, stage: int, compiled: bool) -> Step:
    import deepspeed

    model = build(a)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=adamw(model.parameters()),
                                           model_parameters=model.parameters(), config=engine_config(a, stage),
                                           dist_init_required=False)
    if compiled:
        engine.compile(backend=a.backend)
    return engine_step(engine)


def setup_fsdp2(a: argparse.Namespace, compiled: bool) -> Step:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build(a)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        if compiled:
            block.compile(backend=a.backend)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return plain_step(model, adamw(model.parameters()))


def setup_torch(a: argparse.Namespace, compiled: bool) -> Step:
    """No engine, no communication: each rank trains its own replica (``model.compile()`` whole when
    compiled): what compile gives this model's local step by itself, the ceiling for every system."""
    model = build(a)
    if compiled:
        model.compile(backend=a.backend)
    return plain_step(model, adamw(model.parameters()))


def setup(a: argparse.Namespace, system: str, compiled: bool) -> Step:
    if system == "fsdp2":
        return setup_fsdp2(a, compiled)
    if system == "torch":
        return setup_torch(a, compiled)
    stage = int(system.rsplit("z", 1)[1])
    return (setup_zerorun if system.startswith("zerorun") else setup_deepspeed)(a, stage, compiled)


def timed(step: Step, tokens: torch.Tensor) -> tuple[float, float]:
    """(loss, the slowest rank's seconds); a step that raises on every rank alike (before any collective
    diverges) gives (nan, nan), and the arm is left out from then on."""
    dist.barrier()
    t0 = time.perf_counter()
    try:
        loss = step(tokens)
    except RuntimeError as e:
        print(f"[rank {dist.get_rank()}] step failed: {str(e).splitlines()[0]}", flush=True)
        return float("nan"), float("nan")
    took = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return loss, float(took)


def dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]), "breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values())}


def run(a: argparse.Namespace) -> dict:
    import torch._dynamo

    # arms share nn.Module._call_impl's and Block.forward's code objects: room for every arm's guards
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    rank, world = dist.get_rank(), dist.get_world_size()
    arms = [(s, c) for s in a.systems.split(",") for c in (False, True)]
    steps: dict[tuple[str, bool], Step] = {}
    out: dict[str, dict] = {f"{s}{'+compile' if c else ''}": {"losses": [], "times": []} for s, c in arms}
    for s, c in arms:  # first two steps alone: the compile (and a recompile, were there one) apart
        torch._dynamo.utils.counters.clear()
        steps[(s, c)] = setup(a, s, c)
        rec = out[f"{s}{'+compile' if c else ''}"]
        for k in range(2):
            failed = any(x != x for x in rec["losses"])
            loss, took = (float("nan"), float("nan")) if failed else timed(steps[(s, c)], tokens_for(a, k, rank, world))
            rec["losses"].append(loss)
            rec["first" if k == 0 else "second"] = took
        if c:
            rec["dynamo"] = dynamo_counts()
    for k in range(2, a.steps):  # interleaved
        for s, c in arms:
            if any(x != x for x in out[f"{s}{'+compile' if c else ''}"]["losses"]):
                continue  # this arm failed a step: out
            loss, took = timed(steps[(s, c)], tokens_for(a, k, rank, world))
            rec = out[f"{s}{'+compile' if c else ''}"]
            rec["losses"].append(loss)
            rec["times"].append(took)
    return out


def summarize(a: argparse.Namespace, out: dict[str, dict]) -> list[dict]:
    rows = []
    for s in a.systems.split(","):
        e, c = out[s], out[f"{s}+compile"]
        me, mc = (statistics.median(r["times"]) if r["times"] else float("nan") for r in (e, c))
        diff = max(abs(x - y) / abs(y) for x, y in zip(c["losses"], e["losses"], strict=False))
        rows.append({"system": s, "eager_ms": 1e3 * me, "compiled_ms": 1e3 * mc, "ratio": mc / me,
                     "paired": paired(c["times"], e["times"]),
                     "compile_s": c["first"] - e["first"], "max_rel_loss_diff": diff, **c.get("dynamo", {})})
    return rows


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The GPT's shape, the backend and the seed (shared with bench/compile_phases.py)."""
    p.add_argument("--backend", default="inductor")
    p.add_argument("--arch", choices=("gpt", "llama"), default="gpt",
                   help="gpt: pre-norm blocks on torch's fused kernels; llama: RMSNorm, RoPE, SwiGLU, attention written out")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)


def paired(times: list[float], base: list[float]) -> float:
    """The median over steps of ``times[k] / base[k]``: step k of both arms ran back to back, so a load
    change on a shared machine cancels in each ratio, where a ratio of medians keeps it."""
    ratios = [t / b for t, b in zip(times, base, strict=False) if t == t and b == b]
    return statistics.median(ratios) if ratios else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", default="zerorun-z0,zerorun-z1,zerorun-z2,zerorun-z3,fsdp2,ds-z2,ds-z3")
    p.add_argument("--steps", type=int, default=8)
    add_model_args(p)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trim-heap", action="store_true",
                   help="keep the engine's heap trim (off here: in one process of many arms it is interference)")
    a = p.parse_args()
    if not a.trim_heap:
        # The engine hands glibc's free heap back around its steps when much is free, process-wide: with a
        # dozen models alive one arm's trim returns pages the next arm's eager step faults in again: with it,
        # the job's first arm's eager step ran 20-25% faster than the later arms' (BENCHMARKS.md, issue 49's
        # third part), without it not. A job of one model has no other arm to disturb.
        os.environ["ZERORUN_TRIM_HEAP"] = "0"
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    out = run(a)
    if dist.get_rank() == 0:
        rows = summarize(a, out)
        print(f"{'system':<12} {'eager ms':>9} {'compiled ms':>12} {'ratio':>6} {'paired':>6} {'compile s':>10} "
              f"{'loss diff':>10} {'graphs':>6} {'breaks':>6} {'recompiles':>10}")
        for r in rows:
            print(f"{r['system']:<12} {r['eager_ms']:9.1f} {r['compiled_ms']:12.1f} {r['ratio']:6.3f} "
                  f"{r['paired']:6.3f} {r['compile_s']:10.1f} {r['max_rel_loss_diff']:10.2e} {r.get('graphs', 0):6d} "
                  f"{r.get('breaks', 0):6d} {r.get('recompiles', 0):10d}")
        for x, y in (("zerorun-z3", "fsdp2"), ("zerorun-z2", "fsdp2")):
            if f"{x}+compile" in out and f"{y}+compile" in out:
                print(f"{x}+compile / {y}+compile, paired: "
                      f"{paired(out[f'{x}+compile']['times'], out[f'{y}+compile']['times']):.3f}")
        print("BENCH_COMPILE " + json.dumps({"args": vars(a), "rows": rows, "raw": out}), flush=True)
    dist.destroy_process_group()
    os._exit(0)  # DeepSpeed's and the compiler's worker threads: nothing left to flush


if __name__ == "__main__":
    main()
