"""Lab 00's graders: the references the setup exercises are judged against, and the random inputs
the hidden tests draw from the grading run's seed."""

from __future__ import annotations

import random
from collections import namedtuple
from typing import Any

import torch

from gpulab.devices.batches import tree_map
from gpulab.devices.doctor import compatibility_notes, diagnose
from gpulab.devices.machine import MachineSpec, choose_backend, place_ranks

__all__ = ["REFERENCES", "random_batch", "random_machines", "placement_facts", "doctor_says", "FINDINGS"]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the batch walker behind to_device, the backend and placement rules, and the
# doctor's diagnosis behind triage (the doctor's report then shows no findings while grading).
REFERENCES: tuple = (tree_map, choose_backend, place_ranks, diagnose, compatibility_notes)

# the doctor's findings, in the order triage checks them
FINDINGS = ("cpu-build-on-gpu-machine", "driver-too-old", "gpus-hidden", "minor-version-compat")

Pair = namedtuple("Pair", "image label")


class Tagged(tuple):
    """A tuple subclass that is not a namedtuple: a batch container torch's private pytree leaves alone."""


class Items(list):
    """A list subclass: it must stay a list, and its tensors move too."""


def random_batch(rng: random.Random, depth: int = 3) -> Any:
    """A nested batch of the kinds a DataLoader yields: dicts, lists, tuples, a namedtuple and
    tuple/list subclasses, holding tensors of random shapes and dtypes, strings, numbers and None."""
    def leaf() -> Any:
        kind = rng.randrange(6)
        if kind <= 2:
            shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 3)))
            dtype = rng.choice([torch.float32, torch.int64, torch.uint8, torch.bool])
            return torch.zeros(shape, dtype=dtype) if dtype != torch.float32 else torch.randn(shape)
        return rng.choice([f"file_{rng.randrange(100)}.png", rng.randrange(-5, 50), None, 0.5 * rng.randrange(8)])

    def node(d: int) -> Any:
        if d == 0:
            return leaf()
        kind = rng.randrange(6)
        items = [node(d - 1) for _ in range(rng.randint(1, 3))]
        if kind == 0:
            return {f"k{i}": v for i, v in enumerate(items)}
        if kind == 1:
            return tuple(items)
        if kind == 2:
            return Items(items)
        if kind == 3:
            return Tagged(items)
        if kind == 4:
            return Pair(items[0], node(0))
        return items

    return {"inputs": node(depth), "meta": [node(1), Tagged((leaf(), leaf()))], "target": Pair(leaf(), leaf())}


def random_machines(rng: random.Random, n: int) -> list[tuple[MachineSpec, Any]]:
    """``n`` (machine, world_size) cases: GPU counts, builds, NCCL and 1-4 nodes at random, from 1 to
    twice the GPUs ranks per node; then the cases that tell the rules apart, whatever the seed drew."""
    cases = []
    for _ in range(n):
        gpus, nodes = rng.choice([0, 1, 2, 3, 4, 8]), rng.choice([1, 1, 2, 4])
        spec = MachineSpec(num_gpus=gpus, cuda_build=rng.random() < 0.8, nccl=rng.random() < 0.7, num_nodes=nodes)
        cases.append((spec, nodes * rng.randint(1, max(2, 2 * gpus))))
    # GPUs enough but no NCCL, a GPU per rank with NCCL, more ranks than GPUs, no CUDA build, and the
    # local view: 2 nodes x 8 GPUs take 16 ranks under NCCL, and 3 ranks on each of 2 two-GPU nodes
    # place global rank 3 (local rank 0) on cuda:0
    spec = MachineSpec
    cases += [(spec(4, True, False), 2), (spec(4, True, True), 4), (spec(2, True, True), 3), (spec(2, False, False), 2),
              (spec(8, True, True, num_nodes=2), 16), (spec(2, True, True, num_nodes=2), 6)]
    return cases


def placement_facts(machine: MachineSpec, world_size: int, devices: Any) -> dict[str, Any]:
    """What Exercise 3's rules say of ``devices``, a placement of ``world_size`` ranks on ``machine``.

    Every placement that keeps the rules has the reference's facts, whichever way a node shares too
    few GPUs among its ranks (round-robin, or in blocks).

    Returns:
        The ranks placed; whether every device is one its rank's node can use (``"cuda:i"`` below the
        usable GPUs, ``"cpu"`` only where there is none); whether every node is laid out like the first
        (a device follows the local rank); whether local rank r is on ``cuda:r`` where each rank can
        have a GPU ("n/a" elsewhere); and the most and the fewest ranks on one device of a node. A
        value that is not a list of strings is sent as its repr.
    """
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        return {"returned": repr(devices)[:120]}
    gpus, nodes = machine.usable_gpus, machine.num_nodes
    per_node = world_size // nodes
    usable = [f"cuda:{i}" for i in range(gpus)] or ["cpu"]
    node = devices[:per_node]
    counts = [node.count(d) for d in usable]
    return {
        "ranks placed": len(devices),
        "every device one its node can use": all(d in usable for d in devices),
        "every node laid out alike": all(devices[k * per_node:(k + 1) * per_node] == node for k in range(nodes)),
        "local rank r on cuda:r, the GPUs sufficing": node == usable[:per_node] if 0 < per_node <= gpus else "n/a",
        "most and fewest ranks on one device of a node": [max(counts), min(counts)],
    }


def doctor_says(facts: Any) -> str:
    """The doctor's first finding for ``facts`` (a Facts), in :data:`FINDINGS` order, or "ok"."""
    found = [p.code for p in diagnose(facts)] + [n.code for n in compatibility_notes(facts)]
    return next((c for c in FINDINGS if c in found), "ok")
