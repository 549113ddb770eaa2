"""Send uint8, normalise on the device: four times fewer bytes over the host-to-device link.

A decoded image is uint8 (1 byte per value). Normalising it on the CPU first turns it into
float32 (4 bytes), so the naive pipeline copies four times the bytes and spends CPU time on the
arithmetic. The fix: copy the uint8 batch and normalise just before the model, on the device,
where the arithmetic is nearly free.

    x = to_device_normalize(images_uint8, mean, std, device)   # (B, C, H, W) float32 on device

:func:`normalize_on_host` is the naive version, kept beside it as the reference the fast one
must match (``(x / 255 - mean) / std`` per channel).

    .venv/bin/python -m pytest tests/data/test_transfer.py
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from gpulab.data.synthetic import _check_mean_std

__all__ = ["to_device_normalize", "normalize_on_host", "record_moves"]


def _check_batch(batch: Any) -> int:
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"expected a uint8 tensor of images (..., C, H, W), got {type(batch).__name__}")
    if batch.dtype != torch.uint8:
        raise TypeError(f"expected the uint8 batch, got {batch.dtype}: send uint8 (1 byte per value) and "
                        "normalise after the copy; a float32 batch moves 4x the bytes")
    if batch.dim() < 3:
        raise ValueError(f"expected images shaped (..., C, H, W), got shape {tuple(batch.shape)}")
    return int(batch.shape[-3])


def normalize_on_host(batch_uint8: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """The naive version: float32 ``(x / 255 - mean) / std`` on the CPU (then 4x the bytes to copy)."""
    channels = _check_batch(batch_uint8)
    m, s = _check_mean_std(mean, std, channels)
    # m, s: (C,) -> (C, 1, 1), broadcast over the batch's (..., C, H, W); the result keeps its shape
    return (batch_uint8.float() / 255.0 - m[:, None, None]) / s[:, None, None]


def to_device_normalize(
    batch_uint8: torch.Tensor,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    device: Any,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Copy a uint8 image batch to ``device``, then normalise it there.

    Computes ``(x / 255 - mean) / std`` per channel as one multiply-subtract,
    ``x * (1 / (255 std)) - mean / std``, on the device.

    Args:
        batch_uint8: ``(..., C, H, W)`` uint8 images (pinned, for an asynchronous copy on a GPU).
        mean, std: one value per channel, for images scaled to [0, 1] (e.g. ImageNet's
            ``(0.485, 0.456, 0.406)``, ``(0.229, 0.224, 0.225)``).
        device: a ``torch.device``, a string, or an accelerator from :mod:`gpulab.accel`.
        dtype: the result's dtype (``torch.float16`` / ``bfloat16`` for mixed precision).

    Returns:
        The normalised batch on ``device``, shape unchanged.

    Raises:
        TypeError: if the batch is not a uint8 tensor (it names the fix).
        ValueError: if ``mean``/``std`` do not have one value per channel, or std <= 0.
    """
    channels = _check_batch(batch_uint8)
    m, s = _check_mean_std(mean, std, channels)
    device = getattr(device, "torch_device", device)
    x = batch_uint8.to(device, non_blocking=True)  # 1 byte per value crosses the link
    scale, shift = _affine_on(x.device, dtype, tuple((1.0 / (255.0 * s)).tolist()), tuple((m / s).tolist()))
    return x.to(dtype).mul_(scale).sub_(shift)


@functools.lru_cache(maxsize=32)
def _affine_on(device: torch.device, dtype: torch.dtype, scale: tuple[float, ...],
               shift: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(C, 1, 1)`` scale and shift on ``device``, made once: copying them from pageable host
    memory on every batch would be two blocking host-to-device copies per step, the very sync lab 01
    teaches students to remove."""
    return (torch.tensor(scale, device=device, dtype=dtype)[:, None, None],  # (C,) -> (C, 1, 1)
            torch.tensor(shift, device=device, dtype=dtype)[:, None, None])


class _MoveRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.moves: list[tuple[torch.dtype, torch.dtype | None, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # torch's signature
        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cuda) and args and isinstance(args[0], torch.Tensor):
            rest = list(args[1:]) + list(kwargs.values())
            if func is torch.Tensor.cuda or "device" in kwargs or any(isinstance(a, (torch.device, str, int)) and
                                                                      not isinstance(a, bool) for a in args[1:]):
                target = next((a for a in rest if isinstance(a, torch.dtype)), None)
                self.moves.append((args[0].dtype, target, args[0].numel()))
        return func(*args, **kwargs)


def record_moves(fn: Callable[..., Any], *args: Any,
                 **kwargs: Any) -> tuple[Any, list[tuple[torch.dtype, torch.dtype | None, int]]]:
    """Run ``fn`` and list every ``tensor.to(<device>, ...)`` / ``.cuda()`` it made.

    Returns:
        ``(fn's result, [(source dtype, dtype requested in the same call or None, numel), ...])``:
        what crossed (or would cross) the host-to-device link, even on a CPU-only machine.
    """
    with _MoveRecorder() as rec:
        out = fn(*args, **kwargs)
    return out, rec.moves
