"""Direct preference optimization with TRL's DPOTrainer and a reference model (shaped like trl/scripts/dpo.py).

    deepspeed --num_gpus 2 trl_dpo.py --model_name_or_path CKPT --deepspeed ds_config_zero3.json \
        --output_dir out --per_device_train_batch_size 2 --max_steps 4 --logging_steps 1

CKPT is a local checkpoint with its tokenizer (tiny_llama.save_tiny_llama; nothing is
downloaded); the preference pairs are built here. No ``ref_model`` is passed, so TRL loads
the reference from the same checkpoint and, under DeepSpeed, wraps it in an engine without
an optimizer (trl.models.prepare_deepspeed: sharded like the policy at stage 3, whole at
stage 0 otherwise). Rank 0 writes OUTPUT_DIR/log_history.json and OUTPUT_DIR/run.json.
"""

from dataclasses import dataclass, field

import torch
from datasets import Dataset
from run_clm import cpu_deepspeed_state
from tiny_llama import preference_pairs
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, set_seed
from trl import DPOConfig, DPOTrainer
from trl_sft import write_run


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "a local checkpoint with its tokenizer"})
    num_samples: int = field(default=32, metadata={"help": "preference pairs"})


def main():
    cpu_deepspeed_state()
    script_args, training_args = HfArgumentParser((ScriptArguments, DPOConfig)).parse_args_into_dataclasses()
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(script_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(script_args.model_name_or_path, dtype=torch.float32)
    trainer = DPOTrainer(model=model, args=training_args, processing_class=tokenizer,
                         train_dataset=Dataset.from_dict(preference_pairs(script_args.num_samples)))
    trainer.train()
    ref = trainer.ref_model
    write_run(trainer, ref_engine=type(ref).__module__, ref_has_optimizer=getattr(ref, "optimizer", None) is not None)


if __name__ == "__main__":
    main()
