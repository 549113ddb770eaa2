"""Lab 00's hidden cases tell the rules apart: answers that forget NCCL, the build, or the nodes'
local view (global world size, global rank) disagree with the reference on every seed's draw."""

import random

import pytest

from gpulab.devices.machine import choose_backend, place_ranks
from gpulab.grading import lab00


def global_backend(m, ws):  # compares all GPUs of one node with every rank of the job
    return "nccl" if m.nccl and m.usable_gpus >= ws else "gloo"


def global_placement(m, ws):  # round-robin over global ranks
    return ["cpu"] * ws if m.usable_gpus == 0 else [f"cuda:{r % m.usable_gpus}" for r in range(ws)]


def no_nccl_check(m, ws):
    return "nccl" if m.usable_gpus >= ws // m.num_nodes else "gloo"


@pytest.mark.parametrize("seed", range(20))
def test_the_drawn_machines_refuse_answers_that_miss_a_rule(seed) -> None:
    cases = lab00.random_machines(random.Random(seed), 24)
    for wrong, reference in ((global_backend, choose_backend), (no_nccl_check, choose_backend),
                             (global_placement, place_ranks)):
        assert any(wrong(m, ws) != reference(m, ws) for m, ws in cases), (wrong.__name__, seed)


def test_every_drawn_world_size_splits_over_its_nodes() -> None:
    """A drawn case never trips the reference's own ValueError: the hidden test compares answers."""
    for m, ws in lab00.random_machines(random.Random(0), 200):
        assert ws % m.num_nodes == 0
        assert len(place_ranks(m, ws)) == ws
