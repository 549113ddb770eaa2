"""A small ResNet in double precision and images for it (shared by the pipeline tests)."""

from __future__ import annotations

import torch
from torch import nn

from gpulab.models import resnet
from gpulab.parallel import batchnorm_to_groupnorm


def _model(norm: str = "batch", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = resnet(18, num_classes=5, width=4)
    return (batchnorm_to_groupnorm(model, 2) if norm == "group" else model).double()


def _images(n: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.double)
