"""Lab 00's hidden cases tell the rules apart: answers that forget NCCL, the build, or the nodes'
local view (global world size, global rank) disagree with the reference on every seed's draw."""

import random

import pytest

from gpulab.devices.machine import MachineSpec, choose_backend, place_ranks
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


def blocked_placement(m, ws):  # keeps the rules another way: a node's surplus ranks in blocks, not round-robin
    per, gpus = ws // m.num_nodes, m.usable_gpus
    if gpus == 0:
        return ["cpu"] * ws
    local = [f"cuda:{r}" for r in range(per)] if per <= gpus else [f"cuda:{r * gpus // per}" for r in range(per)]
    return local * m.num_nodes


def first_gpu_only(m, ws):  # every rank on cuda:0: the nodes alike, but the GPUs not shared evenly
    return ["cpu"] * ws if m.usable_gpus == 0 else ["cuda:0"] * ws


def reversed_order(m, ws):  # local rank r on the r-th GPU from the end: breaks torchrun's convention
    per, gpus = ws // m.num_nodes, m.usable_gpus
    return ["cpu"] * ws if gpus == 0 else [f"cuda:{gpus - 1 - (r % per) % gpus}" for r in range(ws)]


def num_gpus_placement(m, ws):  # counts the hardware's GPUs, not the usable ones (a CPU build has none)
    per = ws // m.num_nodes
    return ["cpu"] * ws if m.num_gpus == 0 else [f"cuda:{(r % per) % m.num_gpus}" for r in range(ws)]


@pytest.mark.parametrize("seed", range(20))
def test_placement_facts_accept_any_placement_that_keeps_the_rules(seed) -> None:
    for m, ws in lab00.random_machines(random.Random(seed), 24):
        assert lab00.placement_facts(m, ws, blocked_placement(m, ws)) == lab00.placement_facts(m, ws, place_ranks(m, ws))


@pytest.mark.parametrize("seed", range(20))
def test_placement_facts_refuse_placements_that_break_a_rule(seed) -> None:
    cases = lab00.random_machines(random.Random(seed), 24)
    for wrong in (global_placement, first_gpu_only, reversed_order, num_gpus_placement):
        assert any(lab00.placement_facts(m, ws, wrong(m, ws)) != lab00.placement_facts(m, ws, place_ranks(m, ws))
                   for m, ws in cases), (wrong.__name__, seed)


def test_placement_facts_name_what_is_not_a_placement() -> None:
    assert lab00.placement_facts(MachineSpec(), 2, None) == {"returned": "None"}
    assert lab00.placement_facts(MachineSpec(2, True, True), 2, ("cuda:0", "cuda:1")) == {"returned": "('cuda:0', 'cuda:1')"}
