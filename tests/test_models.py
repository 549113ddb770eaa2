"""gpulab.models: parameter counts match the published ResNets, and every model computes what it says,
value for value, against the same computation written with torch.nn.functional and the same weights.

References: ``F.conv2d``/``F.batch_norm``/``F.relu`` compositions of a BasicBlock, a ResNet v1.5
Bottleneck (the stride on the 3x3) and the stem and head; ``F.linear``/``F.relu`` for the MLP;
``nn.Linear`` + ``F.gelu`` + ``F.cross_entropy`` for the language-model head.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpulab.models import MLP, BasicBlock, Bottleneck, LargeVocabHead, SmallCNN, resnet


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _randomise_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm non-trivial statistics and affine weights, so a missing or misplaced
    normalisation changes the output (fresh ones are the identity in eval mode)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.double().eval()


def _bn(x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, training=False, eps=bn.eps)


def _shortcut_ref(block: nn.Module, x: torch.Tensor, stride: int) -> torch.Tensor:
    if block.downsample is None:
        return x
    conv, bn = block.downsample
    return _bn(F.conv2d(x, conv.weight, stride=stride), bn)


def _basic_ref(block: BasicBlock, x: torch.Tensor, stride: int) -> torch.Tensor:
    """He et al. (2015), Fig. 2: relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x))."""
    out = F.relu(_bn(F.conv2d(x, block.conv1.weight, stride=stride, padding=1), block.bn1))
    out = _bn(F.conv2d(out, block.conv2.weight, padding=1), block.bn2)
    return F.relu(out + _shortcut_ref(block, x, stride))


def _bottleneck_ref(block: Bottleneck, x: torch.Tensor, stride: int) -> torch.Tensor:
    """1x1 reduce, 3x3 carrying the stride (ResNet v1.5), 1x1 expand, plus the shortcut."""
    out = F.relu(_bn(F.conv2d(x, block.conv1.weight), block.bn1))
    out = F.relu(_bn(F.conv2d(out, block.conv2.weight, stride=stride, padding=1), block.bn2))
    out = _bn(F.conv2d(out, block.conv3.weight), block.bn3)
    return F.relu(out + _shortcut_ref(block, x, stride))


@pytest.mark.parametrize("depth, expected", [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032)])
def test_parameter_counts_match_the_paper_models(depth: int, expected: int) -> None:
    # the published figures for ImageNet ResNets (width 64, 1000 classes)
    assert n_params(resnet(depth)) == expected


@pytest.mark.parametrize("cin, planes, stride", [(8, 8, 1), (8, 16, 2), (4, 8, 1)])
def test_basic_block_equals_its_functional_composition(cin: int, planes: int, stride: int) -> None:
    torch.manual_seed(0)
    block = _randomise_norms(BasicBlock(cin, planes, stride))
    assert (block.downsample is None) == (stride == 1 and cin == planes)
    x = torch.randn(2, cin, 9, 9, dtype=torch.double)
    torch.testing.assert_close(block(x), _basic_ref(block, x, stride))


@pytest.mark.parametrize("cin, planes, stride", [(16, 4, 1), (8, 4, 2), (16, 8, 2)])
def test_bottleneck_equals_its_functional_composition(cin: int, planes: int, stride: int) -> None:
    torch.manual_seed(0)
    block = _randomise_norms(Bottleneck(cin, planes, stride))
    x = torch.randn(2, cin, 9, 9, dtype=torch.double)
    torch.testing.assert_close(block(x), _bottleneck_ref(block, x, stride))


@pytest.mark.parametrize("depth", [18, 50])
def test_resnet_equals_stem_blocks_and_head_written_out(depth: int) -> None:
    torch.manual_seed(0)
    model = _randomise_norms(resnet(depth, num_classes=7, width=8))
    x = torch.randn(2, 3, 64, 64, dtype=torch.double)  # 2x2 left for the head's average pooling
    stem, head = model.stages[0], model.stages[-1]
    y = F.max_pool2d(F.relu(_bn(F.conv2d(x, stem[0].weight, stride=2, padding=3), stem[1])), 3, 2, 1)
    ref_block = _basic_ref if depth == 18 else _bottleneck_ref
    for i, stage in enumerate(model.stages[1:-1]):
        for j, block in enumerate(stage):
            y = ref_block(block, y, 2 if (i > 0 and j == 0) else 1)
    logits = F.linear(y.mean(dim=(2, 3)), head[-1].weight, head[-1].bias)
    out = model(x)
    assert out.shape == (2, 7)
    torch.testing.assert_close(out, logits)
    z = x
    for layer in model.layers():  # the split points used by lab 07 compose to the same model
        z = layer(z)
    torch.testing.assert_close(z, out)


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


def test_small_cnn_equals_its_functional_composition() -> None:
    torch.manual_seed(0)
    cnn = _randomise_norms(SmallCNN(num_classes=5, channels=(6, 10)))
    x = torch.randn(3, 3, 16, 16, dtype=torch.double)
    f = cnn.features
    y = x
    for conv, bn in ((f[0], f[1]), (f[4], f[5])):
        y = F.max_pool2d(F.relu(_bn(F.conv2d(y, conv.weight, conv.bias, padding=1), bn)), 2)
    lin = cnn.head[-1]
    torch.testing.assert_close(cnn(x), F.linear(y.mean(dim=(2, 3)), lin.weight, lin.bias))


def test_mlp_equals_linear_relu_linear() -> None:
    torch.manual_seed(0)
    mlp = MLP([4, 8, 6, 2])
    assert n_params(mlp) == 4 * 8 + 8 + 8 * 6 + 6 + 6 * 2 + 2
    (w0, b0), (w1, b1), (w2, b2) = [(m.weight, m.bias) for m in mlp.modules() if isinstance(m, nn.Linear)]
    x = torch.randn(64, 4)
    ref = F.linear(F.relu(F.linear(F.relu(F.linear(x, w0, b0)), w1, b1)), w2, b2)
    out = mlp(x)
    torch.testing.assert_close(out, ref)
    assert (out < 0).any(), "no ReLU after the last layer: logits may be negative"


def test_large_vocab_head_equals_linear_gelu_linear_and_its_loss() -> None:
    torch.manual_seed(0)
    head = LargeVocabHead(hidden=16, vocab=1000)
    assert n_params(head) == 16 * 16 + 16 + 16 * 1000 + 1000
    proj, out = nn.Linear(16, 16), nn.Linear(16, 1000)
    proj.load_state_dict(head.proj.state_dict())
    out.load_state_dict(head.out.state_dict())
    x, y = torch.randn(4, 16), torch.randint(0, 1000, (4,))
    logits = head(x)
    ref = out(F.gelu(proj(x)))
    assert logits.shape == (4, 1000)
    torch.testing.assert_close(logits, ref)
    loss, ref_loss = F.cross_entropy(logits, y), F.cross_entropy(ref, y)
    torch.testing.assert_close(loss, ref_loss)
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(head.out.weight.grad, out.weight.grad)
    torch.testing.assert_close(head.proj.weight.grad, proj.weight.grad)
