"""The small model and data the DDP tests train (shared by test_allreduce, test_nccl and ../test_amp)."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Small, with a layer used twice (its gradient accumulates) and an optional unused branch."""

    def __init__(self, with_unused: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(6, 16)
        self.shared = nn.Linear(16, 16)
        self.out = nn.Linear(16, 3)
        self.unused = nn.Linear(16, 3) if with_unused else None

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.shared(torch.tanh(self.shared(h))))
        return self.out(h)


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(12, 6, generator=g), torch.randint(0, 3, (12,), generator=g)
