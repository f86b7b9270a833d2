"""A Llama-shaped decoder for the compile benchmarks: the parts a modern LLM writes in Python.

``bench/compile.py``'s GPT spends its step in matmuls and in torch's fused kernels
(``scaled_dot_product_attention``, ``layer_norm``, ``gelu``), so on a CPU the compiler has
little to fuse. Llama's blocks as its reference code writes them are mostly elementwise Python:
RMSNorm (square, mean, rsqrt, two products), rotary embeddings (slices, products, a stack),
SwiGLU (silu times a gate) and attention written out (scale, causal mask, softmax). That is the
model where compiled training pays on any device, and the one ``--arch llama`` builds.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, seq, head_dim), pairs of channels rotated."""
    t, half = x.shape[-2], x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (torch.arange(half, device=x.device, dtype=x.dtype) / half))
    angle = torch.outer(torch.arange(t, device=x.device, dtype=x.dtype), freq)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, hidden = heads, 4 * dim * 2 // 3
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).split(d, dim=2))
        scores = (rotate(q) @ rotate(k).transpose(-2, -1)) * (d // self.heads) ** -0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Token embedding tied to the head, ``layers`` blocks, a final RMSNorm (no position table: RoPE)."""

    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.dim)
        self.blocks = nn.ModuleList(LlamaBlock(a.dim, a.heads) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        nn.init.normal_(self.emb.weight, std=0.02)
        for block in self.blocks:  # residual branches scaled down as GPT-2 does: losses stay O(log vocab)
            for lin in (block.out, block.down):
                nn.init.normal_(lin.weight, std=0.02 / (2 * a.layers) ** 0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.emb.weight.t()
