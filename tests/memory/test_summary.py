"""gpulab.memory.summary on ResNets: parameter totals against the published counts, every row's
output shape against running that layer, activation bytes against the shapes; shape mismatches."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gpulab.memory import ShapeMismatchError, summary
from gpulab.models import SmallCNN, resnet

# torchvision's resnet18/34/50 (ImageNet, 1000 classes), the counts of He et al.'s models
PUBLISHED = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032}


@pytest.mark.parametrize("depth", [18, 34, 50])
def test_parameter_totals_match_the_published_resnets(depth) -> None:
    model = resnet(depth)
    s = summary(model, (1, 3, 64, 64))  # the counts do not depend on the image size
    assert s.total_params == PUBLISHED[depth] == s.trainable_params
    assert sum(r.params for r in s.rows) == PUBLISHED[depth]  # every parameter in exactly one row
    assert s.param_bytes == PUBLISHED[depth] * 4 and not s.unused


def test_resnet18_shapes_match_running_each_layer() -> None:
    torch.manual_seed(0)
    model = resnet(18).eval()
    s = summary(model, (2, 3, 224, 224))
    modules = dict(model.named_modules())
    first, last = s.rows[0], s.rows[-1]
    assert (first.name, first.kind, first.output_shape) == ("stages.0.0", "Conv2d", (2, 64, 112, 112))
    assert (last.kind, last.output_shape) == ("Linear", (2, 1000))
    with torch.no_grad():
        for row in s.rows:
            out = modules[row.name](torch.zeros(row.input_shape))
            assert tuple(out.shape) == row.output_shape, row.name
            assert row.activation_bytes == math.prod(row.output_shape) * 4, row.name
        # the stage boundaries, by running model.layers() one after the other
        x = torch.zeros(2, 3, 224, 224)
        shapes = []
        for layer in model.layers():
            x = layer(x)
            shapes.append(tuple(x.shape))
    assert shapes[0] == (2, 64, 56, 56) and shapes[-1] == (2, 1000)
    names = [r.name for r in s.rows]
    assert s.rows[names.index("stages.0.3")].output_shape == shapes[0]  # the stem's max-pool
    block_outputs = [r.output_shape for r in s.rows if r.name.endswith(".relu")][1::2]  # each block's last ReLU
    assert block_outputs == shapes[1:-1]


def test_in_place_and_view_outputs_take_no_memory() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Flatten(), nn.ReLU())
    s = summary(model, (4, 8))
    assert [r.shares_input for r in s.rows] == [False, True, True, False]
    assert s.activation_bytes == 2 * 4 * 8 * 4
    assert "*" in str(s)


def test_a_module_called_twice_gets_two_rows_and_its_parameters_once() -> None:
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 5)
            self.unused = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(self.lin(x))

    s = summary(Twice(), (2, 5))
    assert [r.name for r in s.rows] == ["lin", "lin"] and [r.params for r in s.rows] == [30, 0]
    assert s.total_params == 30 + 12 and s.unused == ["unused"]


def test_shape_mismatch_names_the_layer_and_its_input() -> None:
    model = SmallCNN(num_classes=10, channels=(16, 32))
    model.head[0] = nn.Identity()  # no global pool: the head is written for 32x32 images
    model.head[2] = nn.Linear(32 * 8 * 8, 10)
    assert summary(model, (4, 3, 32, 32)).rows[-1].output_shape == (4, 10)
    with pytest.raises(ShapeMismatchError, match=r"layer 'head.2' .* failed on input \(4, 8192\)") as err:
        summary(model, (4, 3, 64, 64))  # 64x64 images: 32 x 16 x 16 features, not 32 x 8 x 8
    assert err.value.layer == "head.2" and err.value.input_shape == (4, 8192)
    assert [r.name for r in err.value.summary.rows][-1] == "head.1"  # Flatten ran, and shows (4, 8192)
    assert err.value.summary.rows[-1].output_shape == (4, 8192)
    assert "mat1 and mat2" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)
    assert model.training  # the training flag is put back, even after a failure


def test_token_inputs_and_several_inputs() -> None:
    emb = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 4))
    s = summary(emb, (2, 7), dtype=torch.long)
    assert s.rows[-1].output_shape == (2, 7, 4)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(5, 2)

        def forward(self, x, y):
            return self.a(x) + self.b(y)

    s = summary(Two(), [(4, 3), (4, 5)])
    assert [r.output_shape for r in s.rows] == [(4, 2), (4, 2)] and s.input_shape == [(4, 3), (4, 5)]


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match="nn.Module"):
        summary(lambda x: x, (1, 2))
    with pytest.raises(ValueError, match="batch"):
        summary(nn.Linear(2, 2), (0, 2))
    with pytest.raises(ValueError, match="batch"):
        summary(nn.Linear(2, 2), ())
