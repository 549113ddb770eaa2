"""gpulab.parallel.DistributedSampler yields exactly torch's index lists; the unpadded eval sampler
covers every sample once; bad arguments get clear errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.parallel import DistributedSampler, UnpaddedDistributedSampler


@settings(max_examples=400, deadline=None)
@given(n=st.integers(0, 300), num_replicas=st.integers(1, 9), data=st.data(), shuffle=st.booleans(),
       seed=st.integers(0, 2**31), drop_last=st.booleans(), epoch=st.integers(0, 50))
def test_identical_to_torch(n, num_replicas, data, shuffle, seed, drop_last, epoch):
    rank = data.draw(st.integers(0, num_replicas - 1), label="rank")
    ours = DistributedSampler(range(n), num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    ref = torch.utils.data.DistributedSampler(range(n), num_replicas, rank, shuffle=shuffle, seed=seed,
                                              drop_last=drop_last)
    ours.set_epoch(epoch)
    ref.set_epoch(epoch)
    assert list(ours) == list(ref)
    assert len(ours) == len(ref)


def test_padding_repeats_indices_from_the_start():
    shards = [list(DistributedSampler(range(10), 3, r, shuffle=False)) for r in range(3)]
    assert shards == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert [list(DistributedSampler(range(10), 3, r, shuffle=False, drop_last=True)) for r in range(3)] == \
        [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_more_replicas_than_samples_repeats_the_dataset():
    shards = [list(DistributedSampler(range(2), 5, r, shuffle=False)) for r in range(5)]
    assert shards == [[0], [1], [0], [1], [0]]


def test_without_set_epoch_every_epoch_has_the_same_order():
    s = DistributedSampler(range(50), 2, 0, shuffle=True, seed=3)
    first, again = list(s), list(s)
    assert first == again
    s.set_epoch(1)
    other = DistributedSampler(range(50), 2, 1, shuffle=True, seed=3)
    other.set_epoch(1)
    assert list(s) != first
    assert sorted(list(s) + list(other)) == list(range(50)), "the two ranks' shards of one epoch must not overlap"


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 200), num_replicas=st.integers(1, 9), shuffle=st.booleans(), epoch=st.integers(0, 5))
def test_unpadded_sampler_covers_every_sample_once(n, num_replicas, shuffle, epoch):
    shards = []
    for r in range(num_replicas):
        s = UnpaddedDistributedSampler(range(n), num_replicas, r, shuffle=shuffle, seed=1)
        s.set_epoch(epoch)
        shards.append(list(s))
        assert len(s) == len(shards[-1])
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_padding_skews_a_distributed_metric():
    # a "model" right on samples 0..4 and wrong on 5..9: true accuracy 0.5
    correct = [1] * 5 + [0] * 5
    padded = [i for r in range(3) for i in DistributedSampler(range(10), 3, r, shuffle=False)]
    exact = [i for r in range(3) for i in UnpaddedDistributedSampler(range(10), 3, r)]
    assert sum(correct[i] for i in padded) / len(padded) == pytest.approx(7 / 12)  # 0 and 1 counted twice
    assert sum(correct[i] for i in exact) / len(exact) == 0.5


@pytest.mark.parametrize("num_replicas, rank, match", [(3, 3, r"rank=3 is invalid.*\[0, 2\]"), (3, -1, "rank=-1"),
                                                        (0, 0, "num_replicas must be an int >= 1")])
def test_bad_arguments(num_replicas, rank, match):
    with pytest.raises(ValueError, match=match):
        DistributedSampler(range(5), num_replicas, rank)


def test_no_process_group_names_the_fix():
    with pytest.raises(RuntimeError, match="pass num_replicas=world_size, rank=rank"):
        DistributedSampler(range(5))


def test_dataloader_rejects_sampler_with_shuffle():
    """The source posts' "set shuffle=False or it errors": torch's DataLoader refuses both."""
    with pytest.raises(ValueError, match="mutually exclusive"):
        torch.utils.data.DataLoader(range(5), sampler=DistributedSampler(range(5), 1, 0), shuffle=True)
