"""Tiny models and synthetic data for the DeepSpeed-shaped example scripts of this folder.

Plain PyTorch, no engine import: the scripts import it the way DeepSpeed's examples import
their ``model_def.py`` / ``gan_model.py``, and the tests import it to build the
single-process reference of each script.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

IMAGE = (3, 8, 8)
CLASSES = 10


class Net(nn.Module):
    """A CIFAR-10-shaped classifier (conv, pool, conv, three linear layers), sized for 8x8 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 8, 2)
        self.fc1 = nn.Linear(8 * 2 * 2, 24)
        self.fc2 = nn.Linear(24, 16)
        self.fc3 = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = F.relu(self.conv2(x))
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def synthetic_cifar(n: int, seed: int = 0) -> TensorDataset:
    """``n`` images in [-1, 1] whose label depends on them (so the loss can fall)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, *IMAGE, generator=g) * 2 - 1
    labels = (images[:, 0].mean(dim=(1, 2)) * 20 + images[:, 1, 0, 0] * 3).long().remainder(CLASSES)
    return TensorDataset(images, labels)


# ---- GAN (DCGAN-shaped, sized for 8x8 images) ----------------------------------------------
NZ = 8


class Generator(nn.Module):
    def __init__(self, nz: int = NZ, ngf: int = 8, nc: int = 3) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),  # 4x4
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, nc, 4, 2, 1, bias=False),  # 8x8
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf: int = 8, nc: int = 3) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # 4x4
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, 1, 4, 1, 0, bias=False),  # 1x1
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1, 1).squeeze(1)


def weights_init(m: nn.Module) -> None:
    """DCGAN's init: N(0, 0.02) convolutions, N(1, 0.02) batch-norm scales."""
    name = type(m).__name__
    if "Conv" in name:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif "BatchNorm" in name:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


# ---- BERT-style masked language model -------------------------------------------------------
VOCAB, SEQ, MASK_ID = 32, 8, 1


class TinyMLM(nn.Module):
    """Embeddings, one post-norm encoder layer, an MLM head tied to the token embedding."""

    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Embedding(SEQ, hidden)
        self.encoder = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=0.0,
                                                  batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.zeros(VOCAB))

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        h = self.norm(self.encoder(h))
        logits = h @ self.tok.weight.t() + self.bias
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)


def mlm_batch(step: int, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch ``step``: token ids with 25% masked (labels -100 elsewhere), from the step alone."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ids = torch.randint(2, VOCAB, (batch, SEQ), generator=g)
    ids = torch.cumsum(ids, dim=1).remainder(VOCAB - 2) + 2  # a learnable pattern: running sums
    mask = torch.rand(batch, SEQ, generator=g) < 0.25
    mask[:, 0] = True  # every row has a target
    labels = torch.where(mask, ids, torch.full_like(ids, -100))
    return torch.where(mask, torch.full_like(ids, MASK_ID), ids), labels
