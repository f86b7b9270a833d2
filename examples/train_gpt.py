"""A tiny GPT (tied input/output embeddings, LayerNorm, causal nn.MultiheadAttention) trained with zerorun.

    zerorun --num_gpus 2 examples/train_gpt.py --config templates/zero2.yaml
    torchrun --standalone --nproc_per_node 2 examples/train_gpt.py --config templates/zero2.yaml

The text is generated in the script: sentences from a small grammar ("the quick cat
watches a small bird .") tokenised by character. The dataset is handed to
``zerorun.initialize(training_data=...)``, which returns a DistributedSampler-backed
loader of the config's micro batch size. The loss falls from ~ln(vocab) towards the
grammar's entropy.
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import zerorun

DETERMINERS = ["the", "a", "one", "every", "my"]
ADJECTIVES = ["quick", "small", "red", "old", "happy", "quiet"]
NOUNS = ["cat", "dog", "bird", "child", "teacher", "robot", "river"]
VERBS = ["watches", "follows", "sees", "likes", "helps", "finds"]


def generate_text(n_sentences: int, seed: int) -> str:
    rng = random.Random(seed)

    def phrase() -> str:
        adj = f"{rng.choice(ADJECTIVES)} " if rng.random() < 0.5 else ""
        return f"{rng.choice(DETERMINERS)} {adj}{rng.choice(NOUNS)}"

    return " ".join(f"{phrase()} {rng.choice(VERBS)} {phrase()} ." for _ in range(n_sentences))


class CharWindows(Dataset):
    """Windows of ``block + 1`` characters: input = the first ``block``, target = shifted by one."""

    def __init__(self, text: str, block: int) -> None:
        self.chars = sorted(set(text))
        index = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.block = block

    def __len__(self) -> int:
        return len(self.data) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i:i + self.block + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """Pre-norm transformer block; attention is ``nn.MultiheadAttention``, whose forward reads
    its ``out_proj`` child's weight directly (ZeRO stage 3 gathers it on that touch)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)  # True: may not attend
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Embedding):
    """GPT-2's init, N(0, 0.02): nn.Embedding's N(0, 1), tied to the output head, starts the
    loss near 45. It runs in the constructor, so it also holds under zero.Init, which
    shards each module as soon as its own constructor returns."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = Embedding(vocab, dim)
        self.pos = Embedding(block, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied input/output embeddings: one parameter

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--print-every", type=int, default=5)
    zerorun.add_config_arguments(parser)
    args = parser.parse_args()

    data = CharWindows(generate_text(2000, seed=0), args.block)
    torch.manual_seed(0)
    model = TinyGPT(len(data.chars), args.block, args.dim, args.layers, args.heads)
    engine, _, loader, _ = zerorun.initialize(args=args, model=model, model_parameters=model.parameters(),
                                              training_data=data)
    engine.set_sequence_length(args.block)
    rank = engine.ctx.rank
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"tiny GPT: {n:,} parameters (embeddings tied), vocab {len(data.chars)}, "
              f"ZeRO stage {engine.zero_stage}, {engine.precision.name}", flush=True)
    step, micro, epoch, window = 0, 0, 0, []
    while step < args.steps:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(engine.device), y.to(engine.device)  # the rank's GPU (or the CPU on gloo)
            logits = engine(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
            engine.backward(loss)
            engine.step()
            micro += 1
            window.append(loss.item())
            if micro % engine.gradient_accumulation_steps():
                continue
            if rank == 0 and ((step + 1) % args.print_every == 0 or step == args.steps - 1):
                print(f"step {step + 1:3d}  mean loss of {len(window)} micro batches {sum(window) / len(window):.4f}",
                      flush=True)
            if (step + 1) % args.print_every == 0:
                window.clear()
            step += 1
            if step >= args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
