"""A transformer's shape: from flags or a Hugging Face ``config.json``; its parameter count.

The count follows the layout of GPT/Llama-style decoders: per layer, attention
(q and o: h*h each; k and v: h*kv_dim each), the MLP (two matrices of h*ffn, three
when gated as in SwiGLU), two norms; plus the embedding, the final norm and an
untied output head. Tied embeddings are counted once, as an engine that
deduplicates shared parameters holds them once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerorun.errors import ZerorunError

# Several families name the same field differently; the first key found wins.
_KEYS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size"),
    "positions": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx"),
}
DEFAULT_SEQ_LEN = 2048
_GATED_ACTS = {"silu", "swish", "swiglu", "geglu", "gelu_pytorch_tanh_gated"}
_GATED_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "olmo2"}


class ShapeError(ZerorunError):
    """A model shape that cannot be read or is incomplete."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape. ``seq_len`` and ``micro_batch`` are the training inputs per GPU."""

    hidden: int
    layers: int
    heads: int
    vocab: int = 0
    ffn: int = 0  # 0: 4 * hidden
    kv_heads: int = 0  # 0: heads (multi-head attention)
    gated_mlp: bool = False
    tied_embeddings: bool = True
    seq_len: int = DEFAULT_SEQ_LEN
    micro_batch: int = 1
    seq_source: str = "default"  # where seq_len came from: --seq-len, the model config's key, or the default

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    def layer_params(self) -> int:
        """Parameters of one transformer block (weights and the two norms)."""
        h = self.hidden
        attention = 2 * h * h + 2 * h * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_size
        return attention + mlp + 2 * h

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def param_count(self) -> int:
        """Ψ: every block, the embedding, the final norm and an untied head."""
        head = 0 if self.tied_embeddings else self.embedding_params()
        return self.layers * self.layer_params() + self.embedding_params() + self.hidden + head

    def largest_unit(self) -> int:
        """The most parameters gathered at once at stage 3: one block or the embedding."""
        return max(self.layer_params(), self.embedding_params())


def _first(config: dict[str, Any], field: str) -> Any:
    for key in _KEYS[field]:
        if config.get(key) is not None:
            return config[key]
    return None


def _found(config: dict[str, Any], field: str) -> str | None:
    return next((key for key in _KEYS[field] if config.get(key) is not None), None)


def shape_from_hf_config(
    path: str | Path, *, seq_len: int | None = None, micro_batch: int = 1
) -> ModelShape:
    """Read a Hugging Face ``config.json`` (nested ``text_config`` is followed)."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShapeError(f"{path}: no such file", hint="pass the model's config.json to --model") from None
    except json.JSONDecodeError as err:
        raise ShapeError(f"{path}:{err.lineno}: not valid JSON ({err.msg})", hint="--model takes a Hugging Face config.json") from None
    if not isinstance(config, dict):
        raise ShapeError(f"{path}: expected a JSON object", hint="--model takes a Hugging Face config.json")
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    values = {field: _first(config, field) for field in _KEYS}
    missing = [_KEYS[f][0] for f in ("hidden", "layers", "heads") if values[f] is None]
    if missing:
        raise ShapeError(
            f"{path}: missing {', '.join(missing)}",
            hint="give the shape with --hidden/--layers/--heads, or use a config.json with these keys",
        )
    act = str(config.get("hidden_act") or config.get("activation_function") or "").lower()
    gated = act in _GATED_ACTS or str(config.get("model_type", "")).lower() in _GATED_TYPES
    return ModelShape(
        hidden=int(values["hidden"]),
        layers=int(values["layers"]),
        heads=int(values["heads"]),
        vocab=int(values["vocab"] or 0),
        ffn=int(values["ffn"] or 0),
        kv_heads=int(values["kv_heads"] or 0),
        gated_mlp=gated,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        # The model's context length unless --seq-len says otherwise; the table shows which.
        seq_len=int(seq_len or values["positions"] or DEFAULT_SEQ_LEN),
        micro_batch=micro_batch,
        seq_source="--seq-len" if seq_len else _found(config, "positions") or "default",
    )
