"""Less memory per step: bf16 autocast and activation checkpointing, and how to measure the peak.

A training step's peak is mostly activations saved for backward. Two standard ways to shrink it
(what each keeps, and what it costs: the comment below the imports):

- **bf16 autocast** (``torch.autocast(device_type, dtype=torch.bfloat16)``): matmuls and
  convolutions save the activations they produce in 2 bytes instead of 4;
- **activation checkpointing** (``torch.utils.checkpoint.checkpoint``): a checkpointed block keeps
  only its input; backward runs its forward again to get the activations back.

The references here are what lab 08's exercises are compared with; the workloads of
:func:`lab_workloads` (a small CNN and a transformer stack) are what ``benchmarks/memory.py`` measures.

    .venv/bin/python -m pytest tests/memory/fixes/test_savings.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpulab.devices.meter import MemoryMeter
from gpulab.devices.registry import default_for
from gpulab.models import SmallCNN

# - bf16 autocast: matmuls and convolutions run in bfloat16, so the activations they produce and
#   save take 2 bytes instead of 4. The weights stay float32 (autocast casts a bf16 copy per
#   region, cached), so do the gradients; losses run in float32 (on CUDA also softmax and layer
#   norm, which CPU autocast leaves in their input's dtype), and element-wise ops follow their
#   inputs. bf16 has float32's exponent range, so unlike fp16 it needs no loss scaling
#   (``GradScaler``). The seed notes say "fp16"; on a GPU since Ampere, and on CPUs, bf16 is the
#   better default.
# - activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost",
#   arXiv 1604.06174): a checkpointed block keeps only its input; backward runs its forward again
#   to get the activations back. Memory for n blocks drops from n blocks' activations to n inputs
#   plus one block's activations, for about one extra forward pass of compute. Results are the
#   same, exactly.

__all__ = ["peak_memory", "fp32_step", "bf16_step", "segment_sizes", "checkpointed_forward", "checkpointed_step", "Workload", "lab_workloads"]


def peak_memory(fn: Callable[..., Any], *args: Any, track: Any = None, **kwargs: Any) -> int:
    """Peak bytes of tensor storage above the start while ``fn(*args, **kwargs)`` runs.

    Runs under a fresh :class:`~gpulab.devices.MemoryMeter`; ``track`` (the model) is counted as
    already there, so the figure is what the call adds on top of it (activations, gradients,
    temporaries). Gradients that already exist are part of the start: zero them with
    ``set_to_none=True`` first to count them.
    """
    meter = MemoryMeter(timeline=False)
    dev = default_for(_device(args, track))
    if track is not None:
        meter.track(track, dev)
    with meter:
        start = meter.live(dev)
        fn(*args, **kwargs)
    return meter.peak(dev) - start


def _device(args: Sequence[Any], track: Any) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    if isinstance(track, nn.Module):
        for p in track.parameters():
            return p.device
    return torch.device("cpu")


def fp32_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> float:
    """Forward, loss, backward in float32 (the baseline); returns the loss."""
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    return loss.item()


def bf16_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable) -> float:
    """Forward under bf16 autocast, the loss in float32, backward outside autocast; returns the loss.

    Backward runs outside the ``autocast`` block on purpose: its ops use the dtypes the forward
    chose. The loss is computed on float32 logits, as ``torch.amp`` recommends.
    """
    with torch.autocast(device_type=inputs.device.type, dtype=torch.bfloat16):
        outputs = model(inputs)
    loss = loss_fn(outputs.float(), targets)
    loss.backward()
    return loss.item()


def segment_sizes(num_blocks: int, segments: int) -> list[int]:
    """How many consecutive blocks each of ``segments`` runs holds: as equal as possible, the
    earlier runs one block longer when ``num_blocks`` does not divide (5 blocks in 2: ``[3, 2]``).

    Raises:
        ValueError: ``segments`` is not between 1 and ``num_blocks``.
    """
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= num_blocks:
        raise ValueError(f"segments must be an int from 1 (no checkpointing) to {num_blocks} (one block per "
                         f"segment), got {segments!r}")
    return [num_blocks // segments + (i < num_blocks % segments) for i in range(segments)]


def checkpointed_forward(blocks: Sequence[nn.Module], x: torch.Tensor, segments: int | None = None) -> torch.Tensor:
    """Run ``blocks`` in order as ``segments`` runs of consecutive blocks, every run but the last
    under activation checkpointing (default: one block per run).

    Each checkpointed run keeps only its input; backward recomputes the run, so the peak holds one
    run's activations plus every run's input: for n equal blocks with activations A and input I
    each, about (n / k) A + k I for k runs, least near k = sqrt(n A / I) (Chen et al. 2016,
    arXiv 1604.06174). In lab 08's workloads A outweighs I many times, so more runs save more. The last
    run is plain: backward needs its activations first, so recomputing them would save nothing.
    ``use_reentrant=False`` is the implementation torch recommends (it works when the input does
    not require grad, and with keyword arguments). torch's ``checkpoint_sequential`` does the
    same with another split (equal runs, the remainder in the last).
    """
    blocks = list(blocks)
    sizes = segment_sizes(len(blocks), len(blocks) if segments is None else segments)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    runs = [nn.Sequential(*blocks[start:start + size]) for start, size in zip(starts, sizes)]
    for run in runs[:-1]:
        x = checkpoint(run, x, use_reentrant=False)  # keeps x only; recomputes the run in backward
    return runs[-1](x)


def checkpointed_step(blocks: Sequence[nn.Module], inputs: torch.Tensor, targets: torch.Tensor,
                      loss_fn: Callable) -> float:
    """Forward with :func:`checkpointed_forward`, loss, backward; returns the loss."""
    loss = loss_fn(checkpointed_forward(blocks, inputs), targets)
    loss.backward()
    return loss.item()


def _cnn_blocks(model: SmallCNN) -> list[nn.Module]:
    """A SmallCNN as its pieces: one per conv block (conv, BN, ReLU, pool), then the head.

    Warning:
        BatchNorm in training mode updates its running statistics again when a checkpointed
        block is recomputed; the outputs and gradients are unaffected.
    """
    feats = list(model.features)
    return [nn.Sequential(*feats[i:i + 4]) for i in range(0, len(feats), 4)] + [model.head]


def _transformer_stack(num_layers: int = 4, d_model: int = 128, nhead: int = 4, num_classes: int = 10) -> nn.Sequential:
    """``num_layers`` TransformerEncoderLayers (pre-norm, no dropout) and a per-token classifier:
    (B, T, d_model) -> (B, T, num_classes). Iterate over it for its blocks."""
    layers: list[nn.Module] = [nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model, dropout=0.0,
                                                          batch_first=True, norm_first=True)
                               for _ in range(num_layers)]
    return nn.Sequential(*layers, nn.Linear(d_model, num_classes))


def _token_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every token: outputs (B, T, C), targets (B, T)."""
    return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())  # (B, T, C) -> (B*T, C); (B, T) -> (B*T,)


@dataclass
class Workload:
    """A model, its blocks (for checkpointing), one batch, and its loss."""

    model: nn.Module
    blocks: list[nn.Module]
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable


def lab_workloads(device: torch.device | str = "cpu", seed: int = 0) -> dict[str, Workload]:
    """The two workloads lab 08 grades and ``benchmarks/memory.py`` measures, at the same sizes.

    The ratios depend on the sizes: with a smaller batch the weights' bf16 copies and the
    gradients weigh more against the activations, and both techniques save less.

    - ``small_cnn``: SmallCNN with three conv blocks (16, 32, 64 channels), a batch of 32 RGB 32x32;
    - ``transformer``: 4 pre-norm encoder layers (d_model 64, 4 heads), 8 sequences of 64 tokens.
    """
    device = torch.device(device)
    torch.manual_seed(seed)
    cnn = SmallCNN(channels=(16, 32, 64)).to(device)
    tr = _transformer_stack(num_layers=4, d_model=64, nhead=4).to(device)
    return {
        "small_cnn": Workload(cnn, _cnn_blocks(cnn), torch.randn(32, 3, 32, 32, device=device),
                              torch.randint(0, 10, (32,), device=device), F.cross_entropy),
        "transformer": Workload(tr, list(tr), torch.randn(8, 64, 64, device=device),
                                torch.randint(0, 10, (8, 64), device=device), _token_loss),
    }
