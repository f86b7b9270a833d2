"""Single-process references of the example scripts: plain PyTorch, the same seeds and data.

Each function replays what N data-parallel ranks of the script do, in one process: the
step's loss is the mean of the ranks' micro-batch losses (the gradients the engine
averages), and the optimizer is what DeepSpeed builds for the script's config. The
tests compare the scripts' per-rank losses, averaged over ranks, against these.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from tiny_models import NZ, Discriminator, Generator, Net, TinyMLM, mlm_batch, synthetic_cifar, weights_init
from torch import nn
from torch.utils.data.distributed import DistributedSampler


def _clip(model: nn.Module, max_norm: float) -> None:
    if max_norm > 0:  # DeepSpeed: coef = max_norm / (norm + 1e-6), applied when < 1 (as torch's)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def cifar(world: int, micro: int, samples: int, lr: float, betas: tuple[float, float], clip: float) -> list[float]:
    """cifar10_deepspeed.py: config optimizer ``Adam`` (DeepSpeed: AdamW, weight_decay 0), its loader."""
    data = synthetic_cifar(samples)
    torch.manual_seed(1234)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=betas, weight_decay=0.0)
    orders = [list(DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=0)) for r in range(world)]
    losses = []
    for step in range(samples // (world * micro)):
        opt.zero_grad()
        per_rank = []
        for order in orders:
            x, y = data[order[step * micro:(step + 1) * micro]]
            per_rank.append(nn.functional.cross_entropy(net(x), y))
        loss = torch.stack(per_rank).mean()
        loss.backward()
        _clip(net, clip)
        opt.step()
        losses.append(loss.item())
    return losses


def gan(batch: int, samples: int, lr: float, beta1: float, seed: int) -> list[list[float]]:
    """gan_deepspeed_train.py: every rank draws the same batches, so one process is the reference."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(synthetic_cifar(samples), batch_size=batch, shuffle=True)
    netG = Generator()
    netG.apply(weights_init)  # the script's order: the RNG stream must be consumed identically
    netD = Discriminator()
    netD.apply(weights_init)
    optD = torch.optim.Adam(netD.parameters(), lr=lr, betas=(beta1, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=lr, betas=(beta1, 0.999))
    bce, losses = nn.BCELoss(), []
    for real, _ in loader:
        netD.zero_grad()
        ones, zeros = torch.ones(real.size(0)), torch.zeros(real.size(0))
        errD_real = bce(netD(real), ones)
        errD_real.backward()
        fake = netG(torch.randn(real.size(0), NZ, 1, 1))
        errD_fake = bce(netD(fake.detach()), zeros)
        errD_fake.backward()
        optD.step()
        netG.zero_grad()
        errG = bce(netD(fake), ones)
        errG.backward()
        optG.step()
        losses.append([(errD_real + errD_fake).item(), errG.item()])
    return losses


def bert(world: int, micro: int, steps: int, lr: float, clip: float) -> dict[int, float]:
    """train_bert_ds.py: rank r takes rows [r*micro, (r+1)*micro) of each step's global batch."""
    torch.manual_seed(42)
    model = TinyMLM()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = {}
    for step in range(1, steps + 1):
        opt.zero_grad()
        ids, labels = mlm_batch(step, micro * world)
        per_rank = [model(ids[r * micro:(r + 1) * micro], labels[r * micro:(r + 1) * micro]) for r in range(world)]
        loss = torch.stack(per_rank).mean()
        loss.backward()
        _clip(model, clip)
        opt.step()
        losses[step] = loss.item()
    return losses


def accelerate_loop(world: int, micro: int, samples: int, lr: float, clip: float) -> list[float]:
    """accelerate_deepspeed.py: an unshuffled loader sharded by batches (rank r takes batch r of each W)."""
    data = synthetic_cifar(samples)
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(samples // (world * micro)):
        opt.zero_grad()
        x, y = data[step * world * micro:(step + 1) * world * micro]
        per_rank = [nn.functional.cross_entropy(net(x[r * micro:(r + 1) * micro]), y[r * micro:(r + 1) * micro])
                    for r in range(world)]
        loss = torch.stack(per_rank).mean()
        loss.backward()
        _clip(net, clip)
        opt.step()
        losses.append(loss.item())
    return losses


def longtail(world: int, micro: int, samples: int, lr: float, autocast: bool) -> tuple[list[float], list[float]]:
    """longtail_deepspeed.py: client AdamW over one dense group; the full gradient norm before each step."""
    data = synthetic_cifar(samples)
    torch.manual_seed(1234)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.8, 0.999), eps=1e-8, weight_decay=0.0)
    orders = [list(DistributedSampler(data, num_replicas=world, rank=r, shuffle=True, seed=0)) for r in range(world)]
    losses, norms = [], []
    for step in range(samples // (world * micro)):
        opt.zero_grad()
        per_rank = []
        for order in orders:
            x, y = data[order[step * micro:(step + 1) * micro]]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = net(x)
            per_rank.append(nn.functional.cross_entropy(out.float(), y))
        loss = torch.stack(per_rank).mean()
        loss.backward()
        norms.append(sum(float(p.grad.norm()) ** 2 for p in net.parameters()) ** 0.5)
        opt.step()
        losses.append(loss.item())
    return losses, norms
