"""A BERT-style masked language model trained with DeepSpeed, with checkpoints and resume
(shaped like DeepSpeedExamples' training/HelloDeepSpeed/train_bert_ds.py).

    deepspeed --num_gpus 2 train_bert_ds.py --zero_stage 2 --checkpoint_dir ckpt
    deepspeed --num_gpus 2 train_bert_ds.py --zero_stage 2 --checkpoint_dir ckpt --load_checkpoint_dir ckpt

The config is built in the script, as HelloDeepSpeed does; every rank reads its slice of
the step's global batch.
"""

import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist
from tiny_models import TinyMLM, mlm_batch


def is_rank_0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def get_args():
    parser = argparse.ArgumentParser(description="BERT MLM")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--zero_stage", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=4, help="micro batch per GPU")
    parser.add_argument("--num_iterations", type=int, default=6)
    parser.add_argument("--checkpoint_every", type=int, default=3)
    parser.add_argument("--checkpoint_dir", type=str, default="experiments")
    parser.add_argument("--load_checkpoint_dir", type=str, default=None)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out_dir", type=str, default=".")
    return parser.parse_args()


def train(args):
    deepspeed.init_distributed()
    torch.manual_seed(42)
    model = TinyMLM()
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr}},
        "zero_optimization": {"stage": args.zero_stage},
        "gradient_clipping": 1.0,
        "steps_per_print": 100,
    }
    model, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    rank, world = dist.get_rank(), dist.get_world_size()

    start_step = 1
    if args.load_checkpoint_dir is not None:
        _, client_state = model.load_checkpoint(load_dir=args.load_checkpoint_dir)
        checkpoint_step = client_state["checkpoint_step"]
        start_step = checkpoint_step + 1
        if is_rank_0():
            print(f"Resumed from step {checkpoint_step}")

    losses = {}
    for step in range(start_step, args.num_iterations + 1):
        ids, labels = mlm_batch(step, args.batch_size * world)
        rows = slice(rank * args.batch_size, (rank + 1) * args.batch_size)
        loss = model(ids[rows].to(model.device), labels[rows].to(model.device))
        model.backward(loss)
        model.step()
        losses[step] = loss.item()
        if is_rank_0():
            print(f"step {step} loss {loss.item():.4f}")
        if step % args.checkpoint_every == 0:
            model.save_checkpoint(save_dir=args.checkpoint_dir, client_state={"checkpoint_step": step})
    with open(os.path.join(args.out_dir, f"losses_rank{rank}.json"), "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    train(get_args())
