"""The model, data and arithmetic every system of ``scripts/gpu_check.sh --peers`` shares.

A Llama-shaped decoder (pre-norm RMSNorm, causal scaled-dot-product attention, SwiGLU MLP,
untied embedding and head; no positional encoding: the shape and the FLOPs are Llama's, the
loss still falls on the repeated batches), each block under torch's non-reentrant activation
checkpointing. Every system builds it from the same seed on the same device and trains on the
same batches, so the losses of the first step agree to bf16 rounding and the curves stay
within bf16's tolerance.

MFU is the issue's: ``6 * P * tokens / step time / the card's dense bf16 peak`` (no attention
term, no recomputation credit), with the peak named in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

SEED = 1234
LR = 1e-4


@dataclass(frozen=True)
class Shape:
    """A decoder and its inputs; ``layers`` is what part 2 searches."""

    vocab: int
    dim: int
    layers: int
    heads: int
    ffn: int
    seq: int
    batch: int

    def with_layers(self, layers: int) -> Shape:
        return Shape(self.vocab, self.dim, layers, self.heads, self.ffn, self.seq, self.batch)

    @property
    def params_per_layer(self) -> int:
        return 4 * self.dim * self.dim + 3 * self.dim * self.ffn + 2 * self.dim

    @property
    def params(self) -> int:
        return 2 * self.vocab * self.dim + self.dim + self.layers * self.params_per_layer

    @property
    def tokens(self) -> int:
        return self.seq * self.batch


# part 1: ~0.95B (dim 2048, 16 layers, SwiGLU 5632: TinyLlama's width, fewer layers), 4 x 2048 tokens a step
THROUGHPUT_GPU = Shape(vocab=32000, dim=2048, layers=16, heads=16, ffn=5632, seq=2048, batch=4)
THROUGHPUT_CPU = Shape(vocab=64, dim=32, layers=2, heads=2, ffn=64, seq=16, batch=2)
# part 2: Llama 2 7B's width (202M parameters a layer), one sequence of 2048 a step; the depth is searched
OFFLOAD_GPU = Shape(vocab=32000, dim=4096, layers=32, heads=32, ffn=11008, seq=2048, batch=1)
OFFLOAD_CPU = Shape(vocab=64, dim=32, layers=2, heads=2, ffn=64, seq=16, batch=1)

# dense bf16 peak TFLOP/s (without sparsity), by a substring of torch.cuda.get_device_name
PEAKS_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "GH200": 989.0,
                "A100": 312.0, "B200": 2250.0}


def peak_tflops(device_name: str) -> tuple[float | None, str]:
    """The card's dense bf16 peak and what it was matched as (None on the CPU or an unknown card)."""
    for key, value in PEAKS_TFLOPS.items():
        if key in device_name:
            return value, f"{key} dense bf16 {value:g} TFLOP/s"
    return None, f"no dense bf16 peak known for {device_name!r}"


def mfu(params: int, tokens: int, seconds: float, peak: float | None) -> float | None:
    return None if peak is None or seconds <= 0 else 6.0 * params * tokens / seconds / (peak * 1e12)


class Block(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.heads = s.heads
        self.attn_norm = nn.RMSNorm(s.dim)
        self.qkv = nn.Linear(s.dim, 3 * s.dim, bias=False)
        self.proj = nn.Linear(s.dim, s.dim, bias=False)
        self.mlp_norm = nn.RMSNorm(s.dim)
        self.gate_up = nn.Linear(s.dim, 2 * s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self, s: Shape, recompute: bool = True) -> None:
        super().__init__()
        self.recompute = recompute
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.dim)
        self.head = nn.Linear(s.dim, s.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute and self.training else block(x)
        return self.head(self.norm(x))


def make_model(s: Shape, device: torch.device, dtype: torch.dtype = torch.float32) -> Decoder:
    """The same weights for every system: seeded, built directly on ``device`` (in ``dtype``:
    part 2 builds in bf16 so that a model larger than the card in fp32 can be built at all)."""
    torch.manual_seed(SEED)
    if device.type == "cuda":
        torch.cuda.manual_seed(SEED)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Decoder(s)
    finally:
        torch.set_default_dtype(previous)
    return model


def batches(s: Shape, device: torch.device, n: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` fixed batches (the steps cycle through them): the same tokens for every system."""
    gen = torch.Generator().manual_seed(SEED)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, s.vocab, (s.batch, s.seq + 1), generator=gen)
        out.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))
    return out


def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def adamw_block(torch_adam: bool = False) -> dict:
    """The optimizer every system steps: AdamW, lr 1e-4, no weight decay. ``torch_adam``: DeepSpeed's
    documented switch to torch's own AdamW where its fused kernel needs a compiler the machine lacks."""
    params: dict = {"lr": LR, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}
    if torch_adam:
        params["torch_adam"] = True
    return {"type": "AdamW", "params": params}


def loss_agreement(curves: dict[str, list[float]], rtol: float = 2**-5) -> dict:
    """Every curve against the first one, step by step: the largest relative difference (bf16 has 8
    bits of mantissa; after a few steps of different reduction orders 2^-5 is the tolerance)."""
    names = list(curves)
    if not names:
        return {"passed": False, "reference": None, "worst": None}
    ref = curves[names[0]]
    worst = {n: max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(c, ref, strict=False)), default=0.0)
             for n, c in curves.items()}
    return {"reference": names[0], "rtol": rtol, "worst": worst,
            "passed": all(w <= rtol and len(curves[n]) == len(ref) for n, w in worst.items())}
