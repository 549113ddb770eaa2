"""A synthetic image dataset whose samples cost real CPU work: zlib decoding plus augmentation.

Lab 02's input pipeline needs a dataset that behaves like a folder of JPEGs: small on disk,
expensive to turn into a tensor. :class:`SyntheticImages` stores every image as a zlib-compressed
uint8 buffer (deterministic from ``seed``), and each access

1. **decodes** it: ``zlib.decompress``, ``decode_repeats`` times (one repeat for a thumbnail; more
   stand for a larger file) - the part :class:`gpulab.data.loading.InMemoryCache` can keep;
2. **augments** it: a random crop from a zero-padded copy and a random horizontal flip (Python's
   ``random``, which DataLoader seeds per worker) - the part that must run every time;
3. optionally **normalises** it to float32 on the CPU (``normalize=(mean, std)``): the slow
   baseline, which also sends four times the bytes to the device.

Example::

    ds = SyntheticImages(1024, decode_repeats=8)           # uint8 (3, 32, 32) images, int labels
    x, y = ds[0]
    slow = SyntheticImages(1024, decode_repeats=8, normalize=(MEAN, STD))   # float32 on the CPU
"""

from __future__ import annotations

import random
import time
import zlib
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["SyntheticImages", "StallingReads"]


def _check_mean_std(mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor,
                   channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean`` and ``std`` as float tensors of shape ``(channels,)``.

    Raises:
        ValueError: a shape other than one value per channel, or a std that is not positive.
    """
    out = []
    for name, v in (("mean", mean), ("std", std)):
        t = torch.as_tensor(v, dtype=torch.float32).flatten() if not isinstance(v, torch.Tensor) else v.float()
        if t.dim() != 1 or t.numel() != channels:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but the images have {channels} channels; "
                             f"pass one {name} per channel, e.g. a list of {channels} numbers")
        out.append(t)
    if not bool((out[1] > 0).all()):
        raise ValueError(f"std must be positive in every channel, got {out[1].tolist()}")
    return out[0], out[1]


class SyntheticImages(Dataset):
    """``num_samples`` compressed uint8 images with labels; decoding and augmenting cost real CPU.

    Args:
        num_samples: dataset length.
        image_size: images are ``(channels, image_size, image_size)``.
        channels: colour channels.
        num_classes: labels are in ``[0, num_classes)``; each class has its own stripe pattern.
        decode_repeats: how many times each access inflates the buffer (the CPU-cost knob).
        augment: random crop (4-pixel padding) and horizontal flip on every access.
        normalize: ``(mean, std)`` per channel, for images scaled to [0, 1]: return float32
            ``(x / 255 - mean) / std`` computed on the CPU. None returns uint8.
        seed: the images and labels are a deterministic function of the seed.

    Raises:
        ValueError: for sizes < 1, or a ``normalize`` of the wrong shape.
    """

    def __init__(self, num_samples: int = 1024, image_size: int = 32, channels: int = 3, num_classes: int = 10,
                 decode_repeats: int = 1, augment: bool = True,
                 normalize: tuple[Sequence[float], Sequence[float]] | None = None, seed: int = 0) -> None:
        for name, v in (("num_samples", num_samples), ("image_size", image_size), ("channels", channels),
                        ("num_classes", num_classes), ("decode_repeats", decode_repeats)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.num_samples, self.image_size, self.channels = num_samples, image_size, channels
        self.num_classes, self.decode_repeats, self.augment, self.seed = num_classes, decode_repeats, augment, seed
        self.normalize = None if normalize is None else _check_mean_std(*normalize, channels)
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, num_classes, num_samples)
        images = self._draw(rng, self.labels)  # (N, C, H, W) uint8
        self._buffers = [zlib.compress(img.tobytes(), 6) for img in images]

    def _draw(self, rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
        """Stripe patterns whose angle and frequency depend on the label, plus a little noise."""
        n, c, s = len(labels), self.channels, self.image_size
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s  # (H, W)
        angle = (np.pi * labels / self.num_classes).astype(np.float32)[:, None, None]  # (N, 1, 1)
        freq = (2.0 + labels % 4 + rng.uniform(0, 1, n)).astype(np.float32)[:, None, None]
        phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]
        base = np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)  # (N, H, W)
        gain = (0.6 + 0.4 * np.arange(c) / max(1, c - 1)).astype(np.float32)  # (C,)
        img = (127.5 + 100 * base[:, None] * gain[None, :, None, None]) // 8 * 8  # quantised: compresses
        img = img + rng.integers(0, 2, (n, c, s, s), dtype=np.uint8)  # like a photo region, not noise
        return np.clip(img, 0, 255).astype(np.uint8)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        return (self.channels, self.image_size, self.image_size)

    def load(self, index: int) -> tuple[torch.Tensor, int]:
        """Decode image ``index``: a uint8 ``(C, H, W)`` tensor and its label (the cacheable part)."""
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        raw = b""
        for _ in range(self.decode_repeats):  # each repeat inflates the whole buffer again
            raw = zlib.decompress(self._buffers[index])
        img = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(self.shape)
        return img, int(self.labels[index])

    def transform(self, img: torch.Tensor) -> torch.Tensor:
        """Augment (if enabled) and normalise (if enabled) one decoded image (the per-access part).

        The crop is drawn with Python's ``random``, which DataLoader seeds differently in every
        worker (and ``torch.manual_seed`` does not reach), so call ``random.seed`` for repeatable
        crops in the main process.
        """
        if self.augment:
            pad, s = 4, self.image_size
            src = img.numpy()  # (C, H, W), shares memory
            di, dj = random.randint(-pad, pad), random.randint(-pad, pad)  # shift of the crop window
            out = np.zeros_like(src)  # the zero padding that the shifted window uncovers
            out[:, max(0, -di):s - max(0, di), max(0, -dj):s - max(0, dj)] = \
                src[:, max(0, di):s - max(0, -di), max(0, dj):s - max(0, -dj)]
            if random.random() < 0.5:
                out = out[:, :, ::-1]
            img = torch.from_numpy(np.ascontiguousarray(out))
        if self.normalize is not None:
            mean, std = self.normalize
            img = (img.float() / 255.0 - mean[:, None, None]) / std[:, None, None]  # (C, H, W) float32
        return img

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, label = self.load(index)
        return self.transform(img), label


class StallingReads(Dataset):
    """Reads that are quick except now and then, when one waits for storage: a stall.

    Sample ``i`` waits ``read_s``, plus ``stall_s`` when ``i % stall_every == 0``; waiting is a
    ``time.sleep`` (a read blocked on I/O uses no CPU), so the figures do not depend on how busy
    the cores are. With a shuffled loader a batch holds a random number of stalled samples, so
    batch times vary the way they do on shared storage: the mean is low, some batches are slow.

    Args:
        num_samples: dataset length.
        read_s: seconds every read waits.
        stall_s: extra seconds of a stalled read.
        stall_every: one sample index in ``stall_every`` stalls.
        shape: ``(C, H, W)`` of the uint8 images returned (small: the lesson is the waiting).

    Raises:
        ValueError: negative times, or sizes < 1.
    """

    def __init__(self, num_samples: int = 512, read_s: float = 0.0, stall_s: float = 0.020, stall_every: int = 16,
                 shape: tuple[int, int, int] = (3, 8, 8)) -> None:
        if read_s < 0 or stall_s < 0:
            raise ValueError(f"read_s and stall_s must be >= 0 seconds, got {read_s!r} and {stall_s!r}")
        for name, v in (("num_samples", num_samples), ("stall_every", stall_every)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.num_samples, self.read_s, self.stall_s, self.stall_every = num_samples, read_s, stall_s, stall_every
        self.image = torch.zeros(shape, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.num_samples

    def wait_s(self, index: int) -> float:
        """Seconds a read of sample ``index`` waits."""
        return self.read_s + (self.stall_s if index % self.stall_every == 0 else 0.0)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        wait = self.wait_s(index % self.num_samples)
        if wait > 0:
            time.sleep(wait)  # blocked on storage: no CPU used
        return self.image.clone(), index % 10
