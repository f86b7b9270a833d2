"""A tiny Llama and its tokenizer, saved locally, and the text data of the TRL scripts of this folder.

Nothing is downloaded: the tokenizer is a word-level vocabulary of the numbers 0-59 and
four special tokens (64 ids in all, the model's vocabulary), the texts are counting
sequences ("7 10 13 16 ...") a language model can learn. The tests and the bench build
one checkpoint with :func:`save_tiny_llama` and every run, plain or sharded, starts from it
(zero.Init initializes a new model in another order than a plain build, so only loaded
weights are comparable).
"""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = 60  # the numbers "0" .. "59"
SPECIAL = ("<pad>", "<bos>", "<eos>", "<unk>")


def tokenizer():
    """A word-level fast tokenizer over the numbers, with pad/bos/eos/unk set (what TRL needs of one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIAL, *map(str, range(WORDS))])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>")


def save_tiny_llama(path: Path, seed: int = 3, hidden: int = 32, layers: int = 2) -> Path:
    """A seeded Llama (2 layers, hidden 32, untied head) and its tokenizer, written to ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def counting(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` sequences ``start, start + stride, ...`` (mod WORDS) of ``length`` numbers."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, WORDS, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    return ((start + stride * torch.arange(length)).remainder(WORDS)).tolist()


def text(numbers: list[int]) -> str:
    return " ".join(map(str, numbers))


def sft_texts(n: int, length: int = 10, seed: int = 0) -> dict[str, list[str]]:
    """A language-modeling dataset (``{"text": [...]}``), every text ``length`` words long."""
    return {"text": [text(seq) for seq in counting(n, length, seed)]}


def preference_pairs(n: int, prompt: int = 5, completion: int = 3, seed: int = 0) -> dict[str, list[str]]:
    """A preference dataset: the prompt counts on, the chosen completion continues it, the rejected one
    counts backwards (a different length, so the batches carry padding)."""
    rows = counting(n, prompt + completion, seed)
    return {"prompt": [text(r[:prompt]) for r in rows],
            "chosen": [text(r[prompt:]) for r in rows],
            "rejected": [text(reversed(r[:completion + 1])) for r in rows]}
