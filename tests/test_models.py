"""gpulab.models: parameter counts match the published ResNets; shapes and split points are right."""

from __future__ import annotations

import pytest
import torch

from gpulab.models import MLP, LargeVocabHead, SmallCNN, resnet


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("depth, expected", [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032)])
def test_parameter_counts_match_the_paper_models(depth: int, expected: int) -> None:
    # the published figures for ImageNet ResNets (width 64, 1000 classes)
    assert n_params(resnet(depth)) == expected


@pytest.mark.parametrize("depth", [18, 50])
def test_forward_shape_and_layers_compose(depth: int) -> None:
    torch.manual_seed(0)
    model = resnet(depth, num_classes=7, width=8).eval()
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 7)
    y = x
    for layer in model.layers():  # the split points used by lab 07
        y = layer(y)
    torch.testing.assert_close(y, out)


def test_resnet_gradients_flow_to_every_parameter() -> None:
    model = resnet(18, num_classes=3, width=4)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="depth must be one of"):
        resnet(101)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        resnet(18, width=4)(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="at least"):
        MLP([4])


def test_small_models() -> None:
    assert SmallCNN(num_classes=5)(torch.randn(3, 3, 16, 16)).shape == (3, 5)
    mlp = MLP([4, 8, 2])
    assert mlp(torch.randn(5, 4)).shape == (5, 2)
    assert n_params(mlp) == 4 * 8 + 8 + 8 * 2 + 2
    head = LargeVocabHead(hidden=16, vocab=1000)
    assert head(torch.randn(2, 16)).shape == (2, 1000)
    assert n_params(head) == 16 * 16 + 16 + 16 * 1000 + 1000
