"""Which samples each rank reads: ``DistributedSampler`` written from scratch (lab 06).

Data-parallel training gives every rank a different slice of the dataset each epoch. The recipe
(the same as ``torch.utils.data.DistributedSampler``, whose index lists this one reproduces
exactly):

1. one permutation of ``range(N)`` that *every rank computes identically*: ``torch.randperm``
   with a generator seeded by ``seed + epoch`` (no communication needed);
2. make the length divisible by ``num_replicas``: pad by repeating indices from the start
   (default), or drop the tail (``drop_last=True``);
3. rank ``r`` takes every ``num_replicas``-th index starting at ``r``.

Two traps the lab measures:

- **set_epoch.** The permutation depends on ``seed + epoch``, and ``epoch`` only changes when you
  call ``sampler.set_epoch(epoch)``. Forget it and every epoch visits the samples in the same order.
- **padding.** N=10 over 3 ranks gives ``[[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]``: samples 0
  and 1 are seen twice. Harmless noise in training, but a metric averaged over the ranks then
  counts them twice. :class:`UnpaddedDistributedSampler` gives uneven shards with every sample
  exactly once, for evaluation.

Two guards, as torch has: ``rank``/``num_replicas`` may be any integer that ``operator.index``
accepts (a numpy integer, a one-element integer tensor), never a bool or a float; and iterating
after the dataset changed size raises, since shards computed for the old size would give ranks
different numbers of indices (and DDP then hangs: a rank with fewer batches stops calling the
all-reduce that the others wait in).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Iterator, Sequence, Sized

import torch
from torch.utils.data import Sampler

__all__ = ["DistributedSampler", "UnpaddedDistributedSampler", "epoch_orders", "distributed_accuracy"]


def _as_int(value: Any, name: str) -> int:
    """``value`` as a plain int, if ``operator.index`` takes it (numpy ints, one-element int tensors).

    Bools are refused although ``operator.index(True)`` is 1: ``rank=True`` is a bug, not rank 1.
    """
    dtype = getattr(value, "dtype", None)  # numpy's bool_ and torch's bool tensors are bools too
    if isinstance(value, bool) or dtype is torch.bool or str(dtype) == "bool":
        raise TypeError(f"{name} must be an integer, got the bool {value!r}; pass the number itself")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer (an int, a numpy integer or a one-element integer tensor), "
                        f"got {type(value).__name__} {value!r}; if it is a whole number, pass int(...) of it") from None


def _world(num_replicas: Any, rank: Any) -> tuple[int, int]:
    """Fill in ``num_replicas``/``rank`` from the process group, checking both (plain ints back)."""
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("num_replicas and rank were not given and no process group is initialised; "
                               "pass num_replicas=world_size, rank=rank, or call init_process_group first "
                               "(gpulab.parallel.launcher.launch does that for you)")
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    num_replicas, rank = _as_int(num_replicas, "num_replicas"), _as_int(rank, "rank")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be an int >= 1 (the world size), got {num_replicas!r}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank={rank!r} is invalid: it must be in [0, {num_replicas - 1}] for num_replicas={num_replicas}")
    return num_replicas, rank


class DistributedSampler(Sampler[int]):
    """Each rank's share of a dataset, identical to ``torch.utils.data.DistributedSampler``.

    Args:
        dataset: anything with ``len()``.
        num_replicas: the world size (default: from the initialised process group).
        rank: this rank (default: from the process group).
        shuffle: a fresh permutation per epoch (``seed + epoch``) instead of ``0..N-1``.
        seed: must be the same on every rank, or the shards overlap.
        drop_last: drop the tail so shards divide evenly, instead of padding with repeats.

    Raises:
        TypeError: ``num_replicas`` or ``rank`` is not an integer (a bool, a float); numpy integers
            and one-element integer tensors are accepted, as ``operator.index`` accepts them.
        ValueError: ``num_replicas < 1`` or ``rank`` outside ``[0, num_replicas)``.
        RuntimeError: ``num_replicas``/``rank`` omitted without a process group; or, when
            iterating, the dataset changed size since the sampler was built.

    Warning:
        Call :meth:`set_epoch` at the start of every epoch, before iterating. Without it every
        epoch yields the same order. Also give the DataLoader ``shuffle=False`` (the default):
        ``sampler=`` and ``shuffle=True`` together raise, since the sampler already shuffles.

    Warning:
        Build the sampler again (on every rank) after the dataset grows or shrinks: iterating
        raises otherwise. torch raises only where it cannot cut shards of the old size (a shrink
        below them with ``drop_last``, most growths with padding); this one raises on every
        change, because in the other cases the old sizes silently repeat samples (a shrink,
        padded) or skip the new ones (a growth), and a rank that rebuilt its sampler disagrees.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        self.dataset = dataset
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        n = self._dataset_len = len(dataset)  # the shard sizes below hold for this length only
        if drop_last and n % self.num_replicas:
            # largest multiple of num_replicas below n, per rank; ceil of a value in (-1, 0] is 0
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def global_order(self) -> list[int]:
        """The padded (or truncated) index list of all ranks for this epoch, before striding."""
        n = len(self.dataset)
        if n != self._dataset_len:
            raise RuntimeError(
                f"the dataset has {n} samples now but this {type(self).__name__} was built for "
                f"{self._dataset_len}: its shards no longer fit, and ranks that disagree on their number of "
                "batches hang DDP. Build the sampler again (on every rank) after changing the dataset.")
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)  # same seed on every rank -> same permutation
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        if self.drop_last:
            return order[: self.total_size]
        pad = self.total_size - n
        if pad and order:
            order += (order * math.ceil(pad / n))[:pad]  # repeat from the start (n < pad when n < replicas)
        return order

    def __iter__(self) -> Iterator[int]:
        return iter(self.global_order()[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``seed + epoch`` from now on (call it every epoch)."""
        self.epoch = epoch


class UnpaddedDistributedSampler(DistributedSampler):
    """Every sample exactly once across the ranks; shard lengths differ by at most one.

    For distributed *evaluation*: a metric summed over the ranks (``all_reduce`` of correct and
    total counts) is then exactly the single-process metric. Do not use it for training with
    DDP: ranks with fewer batches would stop calling the gradient all-reduce and hang the others.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = False, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=False)
        n = self._dataset_len
        self.num_samples = len(range(self.rank, n, self.num_replicas))
        self.total_size = n

    def __iter__(self) -> Iterator[int]:
        return iter(self.global_order()[self.rank :: self.num_replicas])


# --- measuring the two traps (run these with gpulab.parallel.launcher.launch) ------------------------------

def epoch_orders(rank: int, world_size: int, make_loader: Callable[..., Any], num_samples: int,
                 num_epochs: int, call_set_epoch: bool) -> list[list[int]]:
    """Rank body: the sample ids this rank's loader yields in each epoch.

    ``make_loader(dataset, rank, world_size)`` builds the rank's DataLoader (whose ``sampler`` has
    ``set_epoch``); the dataset yields each sample's own id, so the order is what we record.
    """
    loader = make_loader(torch.arange(num_samples), rank, world_size)
    orders = []
    for epoch in range(num_epochs):
        if call_set_epoch:
            loader.sampler.set_epoch(epoch)
        orders.append([int(i) for batch in loader for i in torch.as_tensor(batch).flatten()])
    return orders


def distributed_accuracy(rank: int, world_size: int, correct: Sequence[bool], padded: bool) -> float:
    """Rank body: accuracy summed over ranks with ``all_reduce``, as distributed evaluation does.

    ``correct[i]`` says whether "the model" gets sample ``i`` right; each rank scores only its
    shard, from :class:`DistributedSampler` (``padded=True``) or :class:`UnpaddedDistributedSampler`.
    """
    import torch.distributed as dist

    from gpulab.parallel.launcher.startup import rank_device

    cls = DistributedSampler if padded else UnpaddedDistributedSampler
    shard = list(cls(range(len(correct)), world_size, rank, shuffle=False))
    counts = torch.tensor([float(sum(correct[i] for i in shard)), float(len(shard))], device=rank_device(rank))
    dist.all_reduce(counts)  # (correct, seen) summed over the ranks
    return (counts[0] / counts[1]).item()
