"""Small, tunable training loops for lab 01 and ``python -m gpulab profile``.

A loop here has two knobs, each a real cost:

- ``sample_cost_s``: CPU time to prepare one sample. :class:`BusyDataset` keeps a core busy for
  that long in ``__getitem__`` (it stands for decoding and augmenting an image; lab 02's
  :mod:`gpulab.data.synthetic` does the real decoding). Run it with ``num_workers=0`` and ``htop``
  shows one core at 100 %, as in the source posts.
- ``compute_s``: device time per step, queued with ``accel.compute`` (see :mod:`gpulab.accel`).

Example::

    accel = pick_accelerator()
    loader = demo_loader(num_batches=20, batch_size=16, sample_cost_s=0.002)   # 32 ms per batch
    prof = profile_loop(loader, demo_step(accel, compute_s=0.012), accel)      # data-bound
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from gpulab.accel import Accelerator, spin

__all__ = ["BusyDataset", "demo_loader", "demo_step"]


class BusyDataset(Dataset):
    """``num_samples`` small uint8 images with labels; each access costs ``sample_cost_s`` of CPU.

    Args:
        num_samples: dataset length.
        sample_cost_s: CPU seconds spent per ``__getitem__`` (a busy loop, so it shows in htop).
        shape: image shape ``(C, H, W)``.
        seed: images are a deterministic function of ``(seed, index)``.
    """

    def __init__(self, num_samples: int = 256, sample_cost_s: float = 0.002,
                 shape: tuple[int, ...] = (3, 32, 32), seed: int = 0) -> None:
        if num_samples < 1 or sample_cost_s < 0:
            raise ValueError(f"need num_samples >= 1 and sample_cost_s >= 0, got {num_samples}, {sample_cost_s}")
        self.num_samples = num_samples
        self.sample_cost_s = sample_cost_s
        gen = torch.Generator().manual_seed(seed)
        self._base = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)  # (C, H, W)
        self._labels = torch.randint(0, 10, (num_samples,), generator=gen)

    def __len__(self) -> int:
        return self.num_samples

    def _sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        return torch.roll(self._base, shifts=index, dims=-1), self._labels[index]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        spin(self.sample_cost_s)  # "decode + augment"
        return self._sample(index)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A whole batch at once (DataLoader uses this when it exists): one busy loop per batch.

        The same CPU time as ``len(indices)`` calls of ``__getitem__``, but on a loaded machine each
        busy loop can end a scheduler time slice late; one per batch keeps batch times steady.
        """
        spin(self.sample_cost_s * len(indices))
        return [self._sample(i) for i in indices]


def demo_loader(num_batches: int = 30, batch_size: int = 16, sample_cost_s: float = 0.002,
                num_workers: int = 0, **loader_kwargs: Any) -> DataLoader:
    """A DataLoader over a :class:`BusyDataset` with exactly ``num_batches`` batches."""
    ds = BusyDataset(num_batches * batch_size, sample_cost_s)
    return DataLoader(ds, batch_size=batch_size, num_workers=num_workers, **loader_kwargs)


def demo_step(accel: Accelerator, compute_s: float = 0.012, sync: bool = False) -> Callable[[Any], Any]:
    """A step function: ``compute_s`` of device work per batch, with a ``.item()`` if ``sync``.

    The synchronous version is the classic ``running_loss += loss.item()`` written every step.
    """

    def step(batch: Any) -> Any:
        inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
        loss = accel.compute(compute_s, inputs)
        if sync:
            return loss.item()  # waits for the device: a host-device sync every step
        return loss

    step.__name__ = "sync_step" if sync else "async_step"
    return step
