"""Supervised fine-tuning with TRL's SFTTrainer (shaped like trl/scripts/sft.py), full or LoRA.

    deepspeed --num_gpus 2 trl_sft.py --model_name_or_path CKPT --deepspeed ds_config_zero3.json \
        --output_dir out --per_device_train_batch_size 2 --max_steps 4 --logging_steps 1 \
        [--use_peft] [--gradient_checkpointing --gradient_checkpointing_kwargs '{"use_reentrant": false}'] \
        [--generate_every 2]

CKPT is a local checkpoint with its tokenizer (tiny_llama.save_tiny_llama; nothing is
downloaded: set HF_HUB_OFFLINE=1); the dataset is built here. ``--use_peft`` trains a LoRA
adapter (peft) on the attention projections. ``--generate_every N`` generates greedily from
fixed prompts after every N-th optimizer step through TRL's unwrap_model_for_generation,
as TRL's online trainers do between steps. Rank 0 writes the Trainer's log history to
OUTPUT_DIR/log_history.json, and to OUTPUT_DIR/run.json what ran and the generated ids.
"""

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset
from peft import LoraConfig
from run_clm import cpu_deepspeed_state
from tiny_llama import counting, sft_texts
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, TrainerCallback, set_seed
from transformers.integrations import is_deepspeed_zero3_enabled
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.trainer_pt_utils import get_model_param_count
from trl import SFTConfig, SFTTrainer
from trl.models import unwrap_model_for_generation


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "a local checkpoint with its tokenizer"})
    num_samples: int = field(default=32, metadata={"help": "training texts"})
    use_peft: bool = field(default=False, metadata={"help": "train a LoRA adapter instead of every weight"})
    lora_r: int = field(default=4, metadata={"help": "LoRA rank"})
    generate_every: int = field(default=0, metadata={"help": "generate after every N-th step (0: never)"})


class GenerateCallback(TrainerCallback):
    """Greedy generation between optimizer steps, on every rank (a stage-3 gather is collective)."""

    def __init__(self, every: int, prompts: torch.Tensor) -> None:
        self.every, self.prompts, self.trainer, self.generations = every, prompts, None, {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every:
            return
        trainer = self.trainer
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as unwrapped:
            ids = unwrapped.generate(input_ids=self.prompts, attention_mask=torch.ones_like(self.prompts),
                                     max_new_tokens=4, do_sample=False)
        self.generations[state.global_step] = ids[:, self.prompts.shape[1]:].tolist()


def main():
    cpu_deepspeed_state()
    script_args, training_args = HfArgumentParser((ScriptArguments, SFTConfig)).parse_args_into_dataclasses()
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(script_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(script_args.model_name_or_path, dtype=torch.float32)
    peft_config = None
    if script_args.use_peft:
        peft_config = LoraConfig(r=script_args.lora_r, lora_alpha=2 * script_args.lora_r, lora_dropout=0.0,
                                 target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    callback = None
    if script_args.generate_every:
        prompts = torch.tensor([[tokenizer.bos_token_id, *map(tokenizer.convert_tokens_to_ids, map(str, row))]
                                for row in counting(2, 4, seed=1)])
        callback = GenerateCallback(script_args.generate_every, prompts)
    set_seed(training_args.seed)  # the LoRA weights draw from the same stream whatever loading consumed
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=Dataset.from_dict(sft_texts(
        script_args.num_samples)), processing_class=tokenizer, peft_config=peft_config,
        callbacks=[callback] if callback else None)
    if callback:
        callback.trainer = trainer
    trainer.train()
    write_run(trainer, generations=callback.generations if callback else None)


def _checkpointing(model: torch.nn.Module) -> dict[str, Any]:
    """How many decoder layers recompute in backward, and with which torch checkpoint variant."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    func = getattr(layers[0], "_gradient_checkpointing_func", None) if layers else None
    return {"layers": len(layers), "use_reentrant": getattr(func, "keywords", {}).get("use_reentrant")}


def write_run(trainer, **extra) -> None:
    """Rank 0: the per-step log history, and what ran (the engine's module, ZeRO-3 or not, the model's
    dtype, the trainable parameter count the Trainer reports) with ``extra`` in run.json."""
    if not trainer.is_world_process_zero():
        return
    out = trainer.args.output_dir
    steps = [e for e in trainer.state.log_history if "loss" in e and "step" in e]
    with open(os.path.join(out, "log_history.json"), "w") as f:
        json.dump(steps, f)
    run = {"engine": type(trainer.model_wrapped).__module__, "zero3": is_deepspeed_zero3_enabled(),
           "dtype": str(trainer.model.dtype), "checkpointing": _checkpointing(trainer.model),
           "trainable_params": get_model_param_count(trainer.model, trainable_only=True), **extra}
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(run, f)


if __name__ == "__main__":
    main()
