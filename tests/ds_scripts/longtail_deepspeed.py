"""A DeepSpeed script touching the long tail (shaped like DeepSpeedExamples' training/cifar with --moe
off, the offload-states example and a gradient-logging hook):

    deepspeed --num_gpus 2 longtail_deepspeed.py --deepspeed --deepspeed_config ds_config.json [--offload_states]

A top-level MoE import whose helpers run on a dense model, an op-builder probe, the full gradient
norm from deepspeed.utils.safe_get_full_grad after each backward, optionally offload_states /
reload_states between steps, and whatever precision the config gives (torch_autocast included).
"""

import argparse
import json
import os

import deepspeed
import torch
import torch.nn as nn
from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer
from deepspeed.ops.op_builder import CPUAdamBuilder
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
from deepspeed.utils import safe_get_full_grad
from tiny_models import Net, synthetic_cifar

parser = argparse.ArgumentParser(description="long tail")
parser.add_argument("--samples", default=48, type=int)
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--offload_states", action="store_true")
parser.add_argument("--out_dir", type=str, default=".")
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
trainset = synthetic_cifar(args.samples)
torch.manual_seed(1234)
net = Net()
groups = split_params_into_different_moe_groups_for_optimizer(
    {"params": [p for p in net.parameters() if p.requires_grad], "name": "parameters"})
assert not any(is_moe_param(p) for p in net.parameters())
if CPUAdamBuilder().is_compatible():  # DeepSpeed's compiled CPU Adam when it can build; torch's otherwise
    from deepspeed.ops.adam import DeepSpeedCPUAdam as Adam
else:
    Adam = torch.optim.AdamW
optimizer = Adam(groups, lr=0.01, betas=(0.8, 0.999), eps=1e-8, weight_decay=0.0)
engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=net, optimizer=optimizer,
                                                    training_data=trainset)

criterion = nn.CrossEntropyLoss()
losses, grad_norms = [], []
for x, y in loader:
    loss = criterion(engine(x.to(engine.device)).float(), y.to(engine.device))
    engine.backward(loss)
    # the logging hook: the norm of the full (reduced) gradients, before the step consumes them
    full = [safe_get_full_grad(p) for p in net.parameters()]
    grad_norms.append(sum(float(g.float().norm()) ** 2 for g in full) ** 0.5)
    engine.step()
    losses.append(loss.item())
    if args.offload_states:  # as RLHF frameworks do around generation
        engine.offload_states(device=OffloadDeviceEnum.cpu)
        engine.reload_states()

rank = torch.distributed.get_rank()
with open(os.path.join(args.out_dir, f"losses_rank{rank}.json"), "w") as f:
    json.dump({"losses": losses, "grad_norms": grad_norms}, f)
print("Finished Training")
