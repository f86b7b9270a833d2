"""Causal language modeling with the Hugging Face Trainer (shaped like transformers' examples/pytorch/language-modeling/run_clm.py).

    deepspeed --num_gpus 2 run_clm.py --deepspeed ds_config_zero2.json --output_dir out \
        --per_device_train_batch_size 2 --max_steps 6 --logging_steps 1

The model is a small GPT-2 built from a local config (no download: set HF_HUB_OFFLINE=1);
the data are synthetic token blocks. Rank 0 writes the Trainer's log history
(loss, grad_norm, learning_rate per step) to OUTPUT_DIR/log_history.json.
"""

import json
import os
import sys
from dataclasses import dataclass, field

import torch
from accelerate import PartialState
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(default=None, metadata={"help": "a local checkpoint to fine-tune; "
                                                                    "default: a new model from the fields below"})
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=32, metadata={"help": "hidden size"})
    n_head: int = field(default=2, metadata={"help": "attention heads"})
    vocab_size: int = field(default=64, metadata={"help": "vocabulary size"})


@dataclass
class DataTrainingArguments:
    block_size: int = field(default=16, metadata={"help": "tokens per training sample"})
    num_samples: int = field(default=64, metadata={"help": "synthetic training samples"})


class TokenBlocks(torch.utils.data.Dataset):
    """Blocks of a repeating, noisy token stream (a pattern a language model can learn)."""

    def __init__(self, num_samples: int, block_size: int, vocab_size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab_size, (num_samples, 1), generator=g)
        stride = torch.randint(1, 4, (num_samples, 1), generator=g)
        self.ids = (start + stride * torch.arange(block_size)).remainder(vocab_size)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def cpu_deepspeed_state() -> PartialState | None:
    """On a machine without a GPU, accelerate joins a multi-process DeepSpeed run only for an explicitly
    named backend, which the Trainer does not pass: configure the state first (then run with
    ``--accelerator_config '{"use_configured_state": true}'``)."""
    if torch.cuda.is_available() or "LOCAL_RANK" not in os.environ or "--deepspeed" not in sys.argv:
        return None
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    return PartialState(backend="gloo")


def main():
    cpu_deepspeed_state()
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    # Set seed before initializing model.
    set_seed(training_args.seed)
    config = GPT2Config(n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=model_args.n_head,
                        vocab_size=model_args.vocab_size, n_positions=data_args.block_size,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        model = AutoModelForCausalLM.from_config(config)
    n_params = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    print(f"Training new model from scratch - Total size={n_params / 2**20:.2f}M params")

    train_dataset = TokenBlocks(data_args.num_samples, data_args.block_size, model_args.vocab_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset,
                      data_collator=default_data_collator)
    train_result = trainer.train()
    if trainer.is_deepspeed_enabled:  # with --torch_compile, accelerate compiled the engine (engine.compile)
        print(f"engine.is_compiled: {trainer.model_wrapped.is_compiled}")
    trainer.save_model()  # Saves the tokenizer too for easy upload
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    if trainer.is_world_process_zero():
        steps = [e for e in trainer.state.log_history if "loss" in e and "step" in e]
        with open(os.path.join(training_args.output_dir, "log_history.json"), "w") as f:
            json.dump(steps, f)


if __name__ == "__main__":
    main()
