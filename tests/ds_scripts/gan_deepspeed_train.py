"""DCGAN trained with two DeepSpeed engines and client optimizers (shaped like DeepSpeedExamples' training/gan).

    deepspeed --num_gpus 2 gan_deepspeed_train.py --deepspeed --deepspeed_config gan_ds_config.json

As in the original, every rank seeds the same way and draws the same batches; the
discriminator and generator modules are called directly and zeroed with ``zero_grad()``.
"""

import argparse
import json
import os
import random

import deepspeed
import numpy as np
import torch
import torch.nn as nn
from deepspeed.accelerator import get_accelerator
from tiny_models import NZ, Discriminator, Generator, synthetic_cifar, weights_init


def get_argument_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batchSize", type=int, default=8, help="input batch size")
    parser.add_argument("--epochs", type=int, default=1, help="number of epochs to train for")
    parser.add_argument("--samples", type=int, default=32, help="size of the synthetic data set")
    parser.add_argument("--lr", type=float, default=0.0002, help="learning rate, default=0.0002")
    parser.add_argument("--beta1", type=float, default=0.5, help="beta1 for adam. default=0.5")
    parser.add_argument("--manualSeed", type=int, default=999, help="manual seed")
    parser.add_argument("--out_dir", type=str, default=".", help="where each rank writes its losses")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    return parser


def set_seed(value):
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def train(args):
    set_seed(args.manualSeed)
    dataset = synthetic_cifar(args.samples)
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.batchSize, shuffle=True)
    get_accelerator().set_device(args.local_rank)
    device = torch.device(get_accelerator().device_name(args.local_rank))

    netG = Generator().to(device)
    netG.apply(weights_init)
    netD = Discriminator().to(device)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    real_label, fake_label = 1, 0

    # setup optimizer
    optimizerD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(args.beta1, 0.999))

    model_engineD, optimizerD, _, _ = deepspeed.initialize(args=args, model=netD,
                                                           model_parameters=netD.parameters(), optimizer=optimizerD)
    model_engineG, optimizerG, _, _ = deepspeed.initialize(args=args, model=netG,
                                                           model_parameters=netG.parameters(), optimizer=optimizerG)
    losses = []
    for epoch in range(args.epochs):
        for i, data in enumerate(dataloader, 0):
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            real = data[0].to(device)
            batch_size = real.size(0)
            label = torch.full((batch_size,), real_label, dtype=real.dtype, device=device)
            output = netD(real)
            errD_real = criterion(output, label)
            model_engineD.backward(errD_real)

            noise = torch.randn(batch_size, NZ, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            model_engineD.backward(errD_fake)
            errD = errD_real + errD_fake
            model_engineD.step()

            # (2) Update G network: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)  # fake labels are real for generator cost
            output = netD(fake)
            errG = criterion(output, label)
            model_engineG.backward(errG)
            model_engineG.step()

            losses.append([errD.item(), errG.item()])
            print(f"[{epoch}/{args.epochs}][{i}/{len(dataloader)}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f}")
    rank = torch.distributed.get_rank()
    with open(os.path.join(args.out_dir, f"losses_rank{rank}.json"), "w") as f:
        json.dump({"losses": losses}, f)


def main():
    parser = get_argument_parser()
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    train(args)


if __name__ == "__main__":
    main()
