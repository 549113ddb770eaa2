"""Lab 09's FSDP2 graders: a right ``wrap_fsdp`` gives what the reference functions expect (one-process
training, the analytic split of the bytes, gpulab's wrapping in the same ranks), and each wrong one
(root only, a block left out, a unit per Linear, the flag ignored or forced, no root) differs from
the reference in the evidence its test cells check."""

from __future__ import annotations

import random

import pytest
import torch
from torch.distributed.fsdp import fully_shard

from gpulab.grading import lab09_fsdp as gf
from gpulab.parallel.sharding.fsdp import BlockMLP

CASE = {"depth": 2, "width": 13, "seed": 5}  # an odd width: rows split 7 / 6 over 2 ranks


def right(model, mesh, reshard_after_forward=True):
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh)


def root_only(model, mesh, reshard_after_forward=True):
    return fully_shard(model, mesh=mesh)


def block_left_out(model, mesh, reshard_after_forward=True):
    for block in list(model.blocks)[:-1]:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh)


def per_linear(model, mesh, reshard_after_forward=True):
    for block in model.blocks:
        for layer in block:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh)


def flag_ignored(model, mesh, reshard_after_forward=True):
    return right(model, mesh)


def always_kept(model, mesh, reshard_after_forward=True):
    return right(model, mesh, reshard_after_forward=False)


def no_root(model, mesh, reshard_after_forward=True):
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def _close(runs, expected, atol=1e-5):
    return all(r["params"].keys() == expected.keys() and
               all(torch.allclose(r["params"][n], p, atol=atol, rtol=0) for n, p in expected.items()) for r in runs)


@pytest.mark.parametrize("case, reshard", [({}, True), (CASE, False)])
def test_a_right_wrapping_gives_the_expected_evidence(case, reshard):
    runs = gf.run_fsdp(right, 2, **case, reshard_after_forward=reshard)
    ref = gf.reference_fsdp(2, **case, reshard_after_forward=reshard)
    single = gf.single_process_params(**case)
    assert _close(runs, single) and _close(ref, single), "FSDP2 on 2 ranks trains like one process"
    expected = gf.expected_local_bytes(2, **case)
    assert [r["local_bytes"] for r in runs] == [r["local_bytes"] for r in ref] == expected
    assert sum(expected) == ref[0]["full_bytes"], "the shards add up to the unsharded model"
    assert gf.structure(runs) == gf.structure(ref)
    depth = case.get("depth", 3)
    blocks = [f"blocks.{i}" for i in range(depth)]
    assert ref[0]["units"] == ["", *blocks]
    assert ref[0]["gathers"] == [(depth + 1, depth if reshard else 0)] * 3, "one all-gather per unit, again per block in backward"


def test_expected_local_bytes_follow_torch_chunk():
    """The analytic split: 13 rows over 3 ranks are 5, 5, 3, and 16 features of 2 ranks are 8, 8."""
    model = BlockMLP(width=13, depth=2)
    for ws in (2, 3, 4):
        want = [0] * ws
        for p in model.parameters():
            for rank, piece in enumerate(torch.chunk(p, ws)):
                want[rank] += piece.numel() * 4
        assert gf.expected_local_bytes(ws, 2, 13) == want
    assert gf.expected_local_bytes(3, 2, 13)[2] < gf.expected_local_bytes(3, 2, 13)[0]


def test_peak_bytes_held_whole_are_the_root_plus_one_block():
    ref = gf.reference_fsdp(2)
    model = BlockMLP()

    def nbytes(m):
        return sum(p.numel() * 4 for p in m.parameters())

    root = nbytes(model.embed) + nbytes(model.head)
    assert gf.peaks(ref[0]) == {"forward": root + nbytes(model.blocks[0]), "backward": root + nbytes(model.blocks[0])}
    assert ref[0]["full_bytes"] == nbytes(model)


@pytest.mark.parametrize("wrong, reshard", [(root_only, True), (block_left_out, True), (per_linear, True),
                                            (always_kept, True), (flag_ignored, False)])
def test_wrong_wrappings_train_right_but_are_caught_by_their_structure(wrong, reshard):
    case = {} if reshard else CASE
    runs = gf.run_fsdp(wrong, 2, **case, reshard_after_forward=reshard)
    ref = gf.reference_fsdp(2, **case, reshard_after_forward=reshard)
    assert _close(runs, gf.single_process_params(**case)), "the training itself is right..."
    assert [r["local_bytes"] for r in runs] == gf.expected_local_bytes(2, **case), "...and so are the bytes at rest"
    assert gf.structure(runs) != gf.structure(ref), "...but not what is gathered, when"


def test_no_root_unit_leaves_parameters_whole_and_unaveraged():
    runs = gf.run_fsdp(no_root, 2)
    assert [r["local_bytes"] for r in runs] != gf.expected_local_bytes(2), "embed and head stay whole on every rank"
    assert not _close(runs, gf.single_process_params()), "their gradients are never averaged"


def test_drawn_cases_change_the_model_and_split_unevenly_sometimes():
    cases = [gf.fsdp_case(random.Random(s)) for s in range(40)]
    assert len({tuple(c.values()) for c in cases}) == 40
    assert any(c["width"] % 2 for c in cases) and any(c["width"] % 2 == 0 for c in cases)
    assert {c["depth"] for c in cases} == {2, 3, 4}
