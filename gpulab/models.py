"""Models used across the labs, written here (no torchvision: it has no CPU wheel matching the
pinned torch).

- :func:`resnet` — ResNet-18/34/50 with BasicBlock / Bottleneck (He et al. 2015, "Deep Residual
  Learning for Image Recognition", arXiv 1512.03385), with a ``width`` knob so CPU runs stay fast.
  At ``width=64`` and 1000 classes the parameter counts are the published ones (11.7 M, 21.8 M,
  25.6 M).
- :class:`SmallCNN` and :class:`MLP` — small models for quick loops and benchmarks.
- :class:`LargeVocabHead` — a language-model head whose output (batch x vocab) dwarfs its input:
  the workload that shows DataParallel's output-device imbalance (labs 04-05).

    from gpulab.models import resnet
    model = resnet(50, num_classes=10, width=16)   # (B, 3, H, W) -> (B, 10)
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet", "SmallCNN", "MLP", "LargeVocabHead"]


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)  # BN follows: no bias


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a skip connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1, self.bn1 = _conv3x3(cin, planes, stride), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv3x3(planes, cout), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4) and a skip connection (ResNet-50). The stride sits on the
    3x3 convolution, as in the widely used "ResNet v1.5"."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """A ResNet as a flat sequence of stages, so it can be split between devices (lab 07).

    ``self.stages`` is an ``nn.Sequential``: stem, layer1..layer4, head. Iterating over it (or over
    :meth:`layers`) gives the natural split points.
    """

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: Sequence[int],
                 num_classes: int = 1000, width: int = 64, in_channels: int = 3) -> None:
        super().__init__()
        if width < 1 or num_classes < 1:
            raise ValueError(f"width and num_classes must be >= 1, got width={width}, num_classes={num_classes}")
        stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),  # (B, w, H/2, W/2)
            nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),  # (B, w, H/4, W/4)
        )
        stages: list[nn.Module] = [stem]
        cin = width
        for i, n in enumerate(layers):
            planes = width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, stride=2 if (i > 0 and j == 0) else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        stages.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)))
        self.stages = nn.Sequential(*stages)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def layers(self) -> list[nn.Module]:
        """The model as a list of sequential pieces (stem, each residual block, head)."""
        out: list[nn.Module] = [self.stages[0]]
        for stage in self.stages[1:-1]:
            out.extend(stage)
        out.append(self.stages[-1])
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"ResNet expects images shaped (B, C, H, W), got {tuple(x.shape)}")
        return self.stages(x)


_DEPTHS = {18: (BasicBlock, (2, 2, 2, 2)), 34: (BasicBlock, (3, 4, 6, 3)), 50: (Bottleneck, (3, 4, 6, 3))}


def resnet(depth: int = 18, num_classes: int = 1000, width: int = 64, in_channels: int = 3) -> ResNet:
    """ResNet-18, -34 or -50.

    Args:
        depth: 18 or 34 (BasicBlock) or 50 (Bottleneck).
        num_classes: size of the final linear layer.
        width: channels of the first stage (64 in the paper); 8-16 keeps CPU runs quick.
        in_channels: image channels.

    Raises:
        ValueError: for an unsupported depth.
    """
    if depth not in _DEPTHS:
        raise ValueError(f"depth must be one of {sorted(_DEPTHS)}, got {depth}")
    block, layers = _DEPTHS[depth]
    return ResNet(block, layers, num_classes=num_classes, width=width, in_channels=in_channels)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear classifier: (B, C, H, W) -> (B, num_classes)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, channels: Sequence[int] = (16, 32)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for c in channels:
            layers += [nn.Conv2d(cin, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            cin = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """Linear layers with ReLU between them; ``sizes=(in, hidden..., out)``."""

    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"MLP needs at least (in, out) sizes, got {tuple(sizes)}")
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LargeVocabHead(nn.Module):
    """A language-model head: (B, hidden) -> (B, vocab) logits.

    With vocab=30,000 and float32, every sample's logits take 120 kB, far more than its
    ``hidden``-sized input: gathering all logits onto one device is what unbalances DataParallel.
    """

    def __init__(self, hidden: int = 256, vocab: int = 30_000) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.act = nn.GELU()
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.proj(x)))
