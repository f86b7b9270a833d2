"""CIFAR-10-style classifier trained with DeepSpeed (shaped like DeepSpeedExamples' training/cifar).

    deepspeed --num_gpus 2 cifar10_deepspeed.py --deepspeed --deepspeed_config ds_config.json

Synthetic 8x8 images instead of the torchvision download; one JSON file of losses per rank.
"""

import argparse
import json
import os

import deepspeed
import torch
import torch.nn as nn
from deepspeed.accelerator import get_accelerator
from tiny_models import Net, synthetic_cifar


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("-e", "--epochs", default=1, type=int, help="number of total epochs (default: 1)")
    parser.add_argument("--samples", default=64, type=int, help="size of the synthetic training set")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--log-interval", type=int, default=2, help="output logging information at a given interval")
    parser.add_argument("--out_dir", type=str, default=".", help="where each rank writes its losses")
    # Include DeepSpeed configuration arguments
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


deepspeed.init_distributed()
args = add_argument()
trainset = synthetic_cifar(args.samples)

torch.manual_seed(1234)
net = Net()
parameters = filter(lambda p: p.requires_grad, net.parameters())

# Initialize DeepSpeed: distributed model, distributed data loader, DeepSpeed optimizer
model_engine, optimizer, trainloader, __ = deepspeed.initialize(
    args=args, model=net, model_parameters=parameters, training_data=trainset)

local_device = get_accelerator().device_name(model_engine.local_rank)
local_rank = model_engine.local_rank
bf16 = model_engine.bfloat16_enabled()
fp16 = model_engine.fp16_enabled()
if local_rank == 0:
    print(f"bf16={bf16} fp16={fp16} zero_stage={model_engine.zero_optimization_stage()}")

criterion = nn.CrossEntropyLoss()
losses = []
for epoch in range(args.epochs):
    running_loss = 0.0
    for i, data in enumerate(trainloader):
        inputs, labels = data[0].to(local_device), data[1].to(local_device)
        if bf16:
            inputs = inputs.to(torch.bfloat16)
        elif fp16:
            inputs = inputs.half()
        outputs = model_engine(inputs)
        loss = criterion(outputs, labels)

        model_engine.backward(loss)
        model_engine.step()

        losses.append(loss.item())
        running_loss += loss.item()
        if local_rank == 0 and i % args.log_interval == (args.log_interval - 1):
            print(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / args.log_interval:.3f}")
            running_loss = 0.0

rank = torch.distributed.get_rank()
with open(os.path.join(args.out_dir, f"losses_rank{rank}.json"), "w") as f:
    json.dump({"losses": losses, "lr": model_engine.get_lr()}, f)
print("Finished Training")
