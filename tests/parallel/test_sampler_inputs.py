"""gpulab's DistributedSampler on the inputs torch's own sampler tests feed it: ``rank`` and
``num_replicas`` as numpy integers or integer tensors (accepted, as torch accepts them; bools and
floats refused clearly), and a dataset that changed size after the sampler was built (a clear
error, where the old sampler gave ranks different numbers of indices and DDP hung)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpulab.parallel import DistributedSampler, UnpaddedDistributedSampler

INTEGER_TYPES = {
    "numpy.int64": np.int64, "numpy.int32": np.int32, "numpy.uint8": np.uint8,
    "0-d tensor": torch.tensor, "0-d int32 tensor": lambda v: torch.tensor(v, dtype=torch.int32),
    "1-element tensor": lambda v: torch.tensor([v]),
}


@pytest.mark.parametrize("as_type", INTEGER_TYPES.values(), ids=INTEGER_TYPES.keys())
@pytest.mark.parametrize("shuffle, drop_last", [(True, False), (False, True)])
def test_integer_like_rank_and_num_replicas_match_torch(as_type, shuffle, drop_last):
    for num_replicas, rank in [(1, 0), (3, 0), (3, 2), (4, 1)]:
        nr, r = as_type(num_replicas), as_type(rank)
        ours = DistributedSampler(range(23), nr, r, shuffle=shuffle, seed=4, drop_last=drop_last)
        ref = torch.utils.data.DistributedSampler(range(23), nr, r, shuffle=shuffle, seed=4, drop_last=drop_last)
        ours.set_epoch(2)
        ref.set_epoch(2)
        assert list(ours) == list(ref) and len(ours) == len(ref)
        assert type(ours.rank) is int and type(ours.num_replicas) is int, "keep plain ints, not numpy or tensors"
    assert list(UnpaddedDistributedSampler(range(10), as_type(3), as_type(1))) == [1, 4, 7]


NOT_INTEGERS = {
    "bool": True, "numpy.bool_": np.bool_(True), "bool tensor": torch.tensor(True),
    "float": 1.0, "numpy.float32": np.float32(1.0), "float tensor": torch.tensor(1.0),
    "2-element tensor": torch.tensor([1, 1]), "str": "1",
}


@pytest.mark.parametrize("value", NOT_INTEGERS.values(), ids=NOT_INTEGERS.keys())
def test_bools_floats_and_other_non_integers_are_refused(value):
    with pytest.raises(TypeError, match=r"rank must be an integer.*got"):
        DistributedSampler(range(10), 3, value)
    with pytest.raises(TypeError, match=r"num_replicas must be an integer.*got"):
        DistributedSampler(range(10), value, 0)


def test_torch_fails_late_on_a_float_rank_where_gpulab_refuses_at_once():
    late = torch.utils.data.DistributedSampler(range(10), 3, 1.0)  # accepted...
    with pytest.raises(TypeError, match="slice indices"):
        list(late)  # ...and fails only when a DataLoader iterates it
    with pytest.raises(TypeError, match=r"pass int\(\.\.\.\)"):
        DistributedSampler(range(10), 3, 1.0)


def test_range_errors_are_unchanged_for_integer_like_values():
    with pytest.raises(ValueError, match=r"rank=3 is invalid"):
        DistributedSampler(range(5), np.int64(3), torch.tensor(3))
    with pytest.raises(ValueError, match="num_replicas must be an int >= 1"):
        DistributedSampler(range(5), torch.tensor(0), 0)


class Resizable(torch.utils.data.Dataset):
    """A dataset whose length can change after a sampler was built (a list that is appended to)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _outcome(sampler) -> str | list[int]:
    try:
        return list(sampler)
    except (AssertionError, ZeroDivisionError, RuntimeError) as err:
        return type(err).__name__


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("built, now", [(10, 7), (10, 0), (10, 13), (9, 12), (3, 2), (0, 4), (12, 11)])
def test_a_dataset_that_changed_size_raises_on_every_rank(built, now, shuffle, drop_last):
    for num_replicas in (2, 3, 4):
        data = Resizable(built)
        ours = [DistributedSampler(data, num_replicas, r, shuffle=shuffle, drop_last=drop_last)
                for r in range(num_replicas)]
        ref = [torch.utils.data.DistributedSampler(data, num_replicas, r, shuffle=shuffle, drop_last=drop_last)
               for r in range(num_replicas)]
        data.n = now
        for rank in range(num_replicas):
            with pytest.raises(RuntimeError, match=rf"has {now} samples now but .* built for {built}.*again"):
                list(ours[rank])
        # torch raises (AssertionError, or ZeroDivisionError for an emptied dataset) where it cannot
        # cut shards of the old size; elsewhere it yields them over data they were not made for
        torch_outcomes = [_outcome(s) for s in ref]
        if now < built and drop_last and now < len(ref[0]) * num_replicas:
            assert torch_outcomes == ["AssertionError"] * num_replicas, "the uneven-shards case"
        data.n = built  # back to the size it was built for: identical to torch again
        assert [list(s) for s in ours] == [list(s) for s in ref]


def test_the_old_symptom_uneven_shards_after_a_shrink():
    data = Resizable(10)
    shards = [DistributedSampler(data, 3, r, shuffle=False, drop_last=True) for r in range(3)]
    data.n = 7  # the previous sampler yielded 3, 2 and 2 indices here: rank 0 waited forever in DDP
    for s in shards:
        with pytest.raises(RuntimeError, match="Build the sampler again"):
            list(s)
    unpadded = UnpaddedDistributedSampler(data, 3, 0)
    data.n = 9
    with pytest.raises(RuntimeError, match="UnpaddedDistributedSampler was built for 7"):
        list(unpadded)
