"""gpulab.parallel.pipeline.norms: GroupNorm makes the model independent of how the batch is cut."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpulab.models import resnet
from gpulab.parallel import batchnorm_to_groupnorm


def _images(n: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.double)


def test_groupnorm_makes_the_model_independent_of_how_the_batch_is_cut():
    model = batchnorm_to_groupnorm(resnet(18, num_classes=5, width=4)).double().train()
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_channels % m.num_groups == 0 for m in norms)
    x = _images()
    torch.testing.assert_close(model(x), torch.cat([model(x[:3]), model(x[3:])]))
    with pytest.raises(ValueError, match="positive int"):
        batchnorm_to_groupnorm(model, 0)
