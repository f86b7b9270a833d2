"""The models ``zerorun simulate`` builds: a built-in decoder of a given size, or a Hugging Face config.

The built-in decoders have the module layout of the families they are named after, so
stage 3 sees the same units (one per Linear, embedding and norm):

* ``llama``: RMSNorm, q/k/v/o projections (grouped-query when ``kv_heads`` < ``heads``),
  a SwiGLU MLP (gate, up, down), no biases, an untied output head;
* ``gpt2``: LayerNorm, biased projections, a GELU MLP, learned positions, the head tied
  to the token embedding (it reads ``embed.weight`` without calling the embedding).

``--params 70B`` picks the family's preset nearest in size - itself when within 5% (70B:
Llama 2 70B; 7B: Llama 2 7B; 1.5B with ``gpt2``: GPT-2 XL) - else its shape with the layer
count that reaches the asked size. Rotary embeddings are left out: they hold no parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from zerorun.errors import ZerorunError
from zerorun.estimate.shape import ModelShape, shape_from_hf_config

Family = Literal["llama", "gpt2"]
FAMILIES = ("llama", "gpt2")
GPT2_POSITIONS = 1024
PRESET_TOLERANCE = 0.05

PRESETS: dict[str, list[ModelShape]] = {
    "llama": [  # TinyLlama 1.1B, Llama 2 7B / 13B / 70B
        ModelShape(hidden=2048, layers=22, heads=32, kv_heads=4, ffn=5632, vocab=32000, gated_mlp=True,
                   tied_embeddings=False),
        ModelShape(hidden=4096, layers=32, heads=32, ffn=11008, vocab=32000, gated_mlp=True, tied_embeddings=False),
        ModelShape(hidden=5120, layers=40, heads=40, ffn=13824, vocab=32000, gated_mlp=True, tied_embeddings=False),
        ModelShape(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=32000, gated_mlp=True,
                   tied_embeddings=False),
    ],
    "gpt2": [  # GPT-2 small, medium, large, XL
        ModelShape(hidden=768, layers=12, heads=12, vocab=50257),
        ModelShape(hidden=1024, layers=24, heads=16, vocab=50257),
        ModelShape(hidden=1280, layers=36, heads=20, vocab=50257),
        ModelShape(hidden=1600, layers=48, heads=25, vocab=50257),
    ],
}


class ModelSpecError(ZerorunError):
    """A model to simulate that cannot be built as asked."""


@dataclass(frozen=True)
class BuiltinSpec:
    """A built-in decoder: its family and shape."""

    family: Family
    shape: ModelShape


def builtin_spec(params: int, family: Family = "llama", seq_len: int = 16, micro_batch: int = 1) -> BuiltinSpec:
    """The family's preset nearest to ``params`` (in log scale), with the layer count that reaches it.

    A count within 5% of a preset is that preset unchanged (70B: Llama 2 70B, 68.98B).
    """
    if family not in FAMILIES:
        raise ModelSpecError(f"no built-in family {family!r}", f"use one of {', '.join(FAMILIES)}")
    base = min(PRESETS[family], key=lambda s: abs(math.log(s.param_count() / params)))
    fixed = base.param_count() - base.layers * base.layer_params()
    layers = max(1, round((params - fixed) / base.layer_params()))
    if abs(math.log(base.param_count() / params)) < PRESET_TOLERANCE:  # "70B" is Llama 2 70B itself
        layers = base.layers
    return BuiltinSpec(family, replace(base, layers=layers, seq_len=seq_len, micro_batch=micro_batch,
                                       seq_source="--seq-len"))


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, shape: ModelShape, bias: bool) -> None:
        super().__init__()
        h, kv = shape.hidden, shape.kv_dim
        self.heads, self.kv_heads = shape.heads, shape.kv_heads or shape.heads
        self.q_proj, self.k_proj = nn.Linear(h, h, bias=bias), nn.Linear(h, kv, bias=bias)
        self.v_proj, self.o_proj = nn.Linear(h, kv, bias=bias), nn.Linear(h, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q = self.q_proj(x).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, -1).transpose(1, 2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, h))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape, bias: bool) -> None:
        super().__init__()
        h, f = shape.hidden, shape.ffn_size
        self.gated = shape.gated_mlp
        if self.gated:
            self.gate_proj = nn.Linear(h, f, bias=bias)
        self.up_proj, self.down_proj = nn.Linear(h, f, bias=bias), nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, shape: ModelShape, family: Family) -> None:
        super().__init__()
        norm = (lambda: RMSNorm(shape.hidden)) if family == "llama" else (lambda: nn.LayerNorm(shape.hidden))
        bias = family == "gpt2"
        self.input_norm, self.attn = norm(), Attention(shape, bias)
        self.post_norm, self.mlp = norm(), MLP(shape, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class Decoder(nn.Module):
    """A decoder-only language model; ``forward(tokens)`` returns the mean next-token loss."""

    def __init__(self, spec: BuiltinSpec) -> None:
        super().__init__()
        shape = spec.shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.positions = nn.Embedding(GPT2_POSITIONS, shape.hidden) if spec.family == "gpt2" else None
        self.layers = nn.ModuleList(Block(shape, spec.family) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden) if spec.family == "llama" else nn.LayerNorm(shape.hidden)
        self.head = None if shape.tied_embeddings else nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        logits = self.head(x) if self.head is not None else F.linear(x, self.embed.weight)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def hf_shape(config: Path, seq_len: int, micro_batch: int) -> ModelShape:
    """The estimate's view of a Hugging Face ``config.json``."""
    return shape_from_hf_config(config, seq_len=seq_len, micro_batch=micro_batch)


def hf_model(config: Path) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` of a ``config.json`` (no weights are downloaded)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ModelSpecError("--model needs Hugging Face transformers, which is not installed",
                             "pip install 'zerorun[dev]' (or transformers), or simulate a built-in shape "
                             "with --params 7B") from None
    try:
        cfg = AutoConfig.from_pretrained(str(config))
    except (OSError, ValueError) as err:
        raise ModelSpecError(f"{config}: not a Hugging Face model config ({err})",
                             "pass the model's config.json to --model") from None
    return AutoModelForCausalLM.from_config(cfg)


class HfLoss(nn.Module):
    """A causal LM's loss on its own inputs: the same ``forward(tokens)`` as :class:`Decoder`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, labels=tokens).loss
