"""A training loop on Hugging Face accelerate with a DeepSpeedPlugin (shaped like accelerate's by_feature examples).

    accelerate launch --use_deepspeed --num_processes 2 accelerate_deepspeed.py --zero_stage 2
    deepspeed --num_gpus 2 accelerate_deepspeed.py --zero_stage 2

The plugin is built in code (``DeepSpeedPlugin(zero_stage=..., gradient_clipping=...)``);
``accelerator.prepare`` hands model, optimizer and loader to ``deepspeed.initialize``.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import InitProcessGroupKwargs, set_seed
from tiny_models import Net, synthetic_cifar
from torch.nn import functional as F


def parse_args():
    parser = argparse.ArgumentParser(description="accelerate + DeepSpeedPlugin")
    parser.add_argument("--zero_stage", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=4, help="per process")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out_dir", type=str, default=".")
    parser.add_argument("--local_rank", type=int, default=-1)
    return parser.parse_args()


def main():
    args = parse_args()
    plugin = DeepSpeedPlugin(zero_stage=args.zero_stage, gradient_accumulation_steps=1, gradient_clipping=1.0)
    # without a GPU, accelerate only joins the process group when a backend is named
    backend = None if torch.cuda.is_available() else "gloo"
    accelerator = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend=backend)])
    set_seed(1234)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    loader = torch.utils.data.DataLoader(synthetic_cifar(args.samples), batch_size=args.batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    model.train()
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        accelerator.print(f"step {len(losses)} loss {loss.item():.4f}")
    with open(os.path.join(args.out_dir, f"losses_rank{accelerator.process_index}.json"), "w") as f:
        json.dump({"losses": losses}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
