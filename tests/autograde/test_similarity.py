"""gpulab.autograde.similarity: pasted references, the course's solution and classmates' answers are
found with names changed; short cells and the release's scaffolding are not."""

from __future__ import annotations

import inspect

from gpulab.autograde import similarity
from gpulab.devices.batches import tree_map

STUB = 'def to_device(batch, device):\n    """Move every tensor."""\n    # YOUR CODE HERE\n    raise NotImplementedError()'
MINE = '''def to_device(batch, device):
    """Move every tensor."""
    if isinstance(batch, dict):
        result = {}
        for key, value in batch.items():
            result[key] = to_device(value, device)
        return result
    if isinstance(batch, (list, tuple)):
        items = [to_device(v, device) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch.to(device) if hasattr(batch, "to") else batch
'''


def test_copies_are_found_with_names_changed_and_honest_cells_are_not() -> None:
    renamed = MINE.replace("batch", "b").replace("result", "out").replace("items", "xs")
    pasted = inspect.getsource(tree_map) + "\ndef to_device(batch, device):\n    return tree_map(lambda t: t.to(device), batch)\n"
    subs = {"ana": {"c": MINE}, "ben": {"c": renamed}, "cho": {"c": pasted}, "dan": {"c": "def to_device(b, d):\n    return b\n"},
            "eve": {"c": STUB}}
    found = similarity.find_copies(subs, {"c": STUB}, {}, similarity.reference_sources([tree_map]))
    assert [m.other for m in found["ana"]] == ["student ben's answer"]
    assert [m.other for m in found["ben"]] == ["student ana's answer"]
    assert [m.other for m in found["cho"]] == ["gpulab's reference gpulab.devices.batches.tree_map"]
    assert found["dan"] == [] and found["eve"] == []  # a short answer, the untouched stub
    assert "cell c is" in found["cho"][0].note()


def test_a_cell_shared_by_many_classmates_is_one_note() -> None:
    ref = similarity.Match("c", "gpulab's reference tree_map", 0.95, 300)
    few = [similarity.Match("c", f"student s{i}'s answer", 0.9 + i / 100, 200) for i in range(2)]
    many = [similarity.Match("d", f"student s{i}'s answer", 1.0 - i / 100, 260) for i in range(7)]
    got = similarity.notes([ref, *few, *many])
    assert got[:3] == [ref.note(), few[0].note(), few[1].note()]
    assert got[3:] == ["cell d is at least 94% the same as the answers of 7 classmates (s0, s1, s2 and 4 more)"]
    same = [similarity.Match("e", f"student t{i}'s answer", 1.0, 260) for i in range(4)]
    assert similarity.notes(same) == ["cell e is 100% the same as the answers of 4 classmates (t0, t1, t2 and 1 more)"]


def test_a_reference_pasted_whole_inside_code_of_ones_own_is_found() -> None:
    wrapper = "\n".join(f"def helper_{i}(x, scale={i}):\n    return [v * scale + {i} for v in x if v is not None]\n"
                        for i in range(6))  # as much code again as the reference: most of the cell is not it
    pasted = inspect.getsource(tree_map) + "\n" + wrapper
    found = similarity.find_copies({"cho": {"c": pasted}}, {"c": STUB}, {}, similarity.reference_sources([tree_map]))
    [match] = found["cho"]
    assert match.share < similarity.THRESHOLD <= match.holds
    assert match.note().startswith("cell c holds ") and "gpulab's reference gpulab.devices.batches.tree_map" in match.note()


def test_a_short_rule_written_alike_by_the_class_is_not_a_copy() -> None:
    """Lab 00's backend and placement rules come to three or four statements: every honest student
    writes them alike, and the solution too. None of them is noted; a helper of nine lines is."""
    import re
    from pathlib import Path

    import nbformat

    source = similarity.answer_cells(nbformat.read(Path(__file__).parents[2] / "notebooks/source/00_setup/00_setup.ipynb",
                                                   as_version=4))
    for cell in ("choose_backend_impl", "place_ranks_impl"):
        answer = re.sub(r"\n?\s*### (BEGIN|END) SOLUTION", "", source[cell])
        found = similarity.find_copies({s: {cell: answer} for s in ("ana", "ben", "cho")}, {}, {cell: source[cell]}, {})
        assert found == {"ana": [], "ben": [], "cho": []}, cell
    helper = inspect.getsource(tree_map)
    assert similarity.find_copies({"ana": {"c": helper}, "ben": {"c": helper}}, {}, {}, {})["ana"]
