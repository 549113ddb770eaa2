"""BatchNorm and micro-batches: why a pipelined model in training mode is not the whole model.

BatchNorm normalises with the mean and variance of the batch it sees. A pipeline feeds each stage
micro-batches, so in ``train()`` mode every micro-batch is normalised with its own statistics (a
noisier estimate from fewer samples), and the running statistics are updated once per
micro-batch instead of once per batch. In ``eval()`` mode BatchNorm uses the running statistics
and the pipelined model computes exactly what the whole model computes.

GPipe (Huang et al. 2019, arXiv 1811.06965) accepts per-micro-batch statistics during training.
Another way out is a normalisation that looks at one sample at a time, such as GroupNorm (Wu & He
2018, "Group Normalization", arXiv 1803.08494): its result does not depend on how the batch is cut,
so the pipelined model's outputs and gradients are those of the whole model.
:func:`batchnorm_to_groupnorm` makes that swap (lab 07 uses it to compare gradients).
"""

from __future__ import annotations

import math

from torch import nn

__all__ = ["batchnorm_to_groupnorm"]


def batchnorm_to_groupnorm(model: nn.Module, num_groups: int = 8) -> nn.Module:
    """Replace every ``BatchNorm1d/2d/3d`` in ``model`` (in place) by a ``GroupNorm``.

    Each new GroupNorm has ``gcd(num_groups, channels)`` groups (so any channel count works), the
    same ``affine`` and ``eps``, and the BatchNorm's device and dtype.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: if ``num_groups`` is not a positive int.
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            c = child.num_features
            ref = next(iter(child.parameters()), child.running_mean)
            kwargs = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
            setattr(model, name, nn.GroupNorm(math.gcd(num_groups, c), c, eps=child.eps, affine=child.affine, **kwargs))
        else:
            batchnorm_to_groupnorm(child, num_groups)
    return model
