"""A DeepSpeed-style training script, written as DeepSpeed's examples are: it must run
unchanged under `zerorun --as_deepspeed --num_gpus 2 ds_classifier.py --deepspeed
--deepspeed_config ds.json --out result.json`. Rank 0 writes the per-step mean loss and
the final (gathered) parameters."""

import argparse
import json

import deepspeed
import deepspeed.comm as dist
import torch
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.utils import set_random_seed
from torch import nn

GLOBAL_BATCH, STEPS = 8, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return 4 * torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)


def get_args():
    parser = argparse.ArgumentParser(description="CIFAR-like classifier")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--out", type=str, required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = get_args()
    deepspeed.init_distributed()
    set_random_seed(0)
    net = Net()
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters())
    device = get_accelerator().current_device_name()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert engine.global_rank == rank and engine.dp_world_size == world and args.local_rank in (-1, engine.local_rank)
    per_rank = GLOBAL_BATCH // world
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[rank * per_rank:(rank + 1) * per_rank].to(device), y[rank * per_rank:(rank + 1) * per_rank].to(device)
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        params = [p.detach().flatten().tolist() for p in engine.module.parameters()]
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"losses": losses, "params": params, "stage": engine.zero_optimization_stage(),
                       "lr": engine.get_lr(), "device": device, "local_rank_flag": args.local_rank}, fh)
    dist.barrier()


if __name__ == "__main__":
    main()
