"""gpulab.memory.snapshot: reads the CUDA memory snapshot's documented format (live blocks, their
frames, sites that grew, the history's timeline), on a snapshot written here by hand, on one that
torch.profiler builds on a CPU, and (GPU) on a real one recorded by MemoryHistory."""

from __future__ import annotations

import pickle

import pytest
import torch

from gpulab.memory import snapshot as snap
from gpulab.memory.profiled import MemoryProfile

USER = "/home/me/train.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"


def _frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


def _block(size, frames, state="active_allocated"):
    return {"size": size, "requested_size": size, "address": 0, "state": state, "frames": frames}


def _snapshot(leaked_blocks: int) -> dict:
    """A model's weights (allocated before recording: no frames), ``leaked_blocks`` activations kept
    by line 12 of train.py through model code at line 30, and a free cached block."""
    kept = [_frame(TORCH, 125, "forward"), _frame(USER, 30, "forward"), _frame(USER, 12, "train"),
            _frame("??", 0, "PyEval_EvalFrame")]
    blocks = [_block(4096, [])] + [_block(2048, kept) for _ in range(leaked_blocks)] + [_block(8192, kept, "inactive")]
    trace = [{"action": "alloc", "size": 2048}, {"action": "alloc", "size": 512},
             {"action": "free_requested", "size": 512}, {"action": "free_completed", "size": 512}]
    return {"segments": [{"device": 0, "address": 0, "total_size": 2**20, "blocks": blocks}],
            "device_traces": [trace]}


def test_live_blocks_are_the_active_ones_largest_first() -> None:
    blocks = snap.live_blocks(_snapshot(3))
    assert [b.size for b in blocks] == [4096, 2048, 2048, 2048]  # the inactive (cached) block is not live
    assert blocks[1].user_frames() == (snap.SnapshotFrame(USER, 30, "forward"), snap.SnapshotFrame(USER, 12, "train"))


def test_sites_group_by_your_frames_and_skip_torch_and_cpp() -> None:
    sites = snap.sites(_snapshot(3))
    assert [(s.nbytes, s.blocks) for s in sites] == [(6144, 3), (4096, 1)]
    assert [f.line for f in sites[0].frames] == [30, 12]
    assert sites[1].frames == ()  # the weights: no frame of yours
    assert [f.line for f in snap.sites(_snapshot(3), depth=1)[0].frames] == [30]
    with pytest.raises(ValueError, match="depth"):
        snap.sites(_snapshot(1), depth=0)


def test_grown_sites_find_the_leak_between_two_snapshots() -> None:
    grown = snap.grown_sites(_snapshot(2), _snapshot(7))
    assert len(grown) == 1  # the weights did not grow
    assert (grown[0].nbytes, grown[0].blocks) == (5 * 2048, 5)
    assert "train.py:12 in train" in str(grown[0])
    assert snap.grown_sites(_snapshot(7), _snapshot(7)) == []


def test_timeline_follows_alloc_and_free_completed() -> None:
    assert snap.timeline(_snapshot(1)) == [2048, 2560, 2048]
    assert snap.timeline(_snapshot(1), device=3) == []


def test_summarize_and_load(tmp_path) -> None:
    text = snap.summarize(_snapshot(3), top=1)
    assert text.splitlines()[0].startswith("snapshot: 10.00 KiB live in 4 blocks")
    assert "6.00 KiB in    3 blocks" in text and "no frame of yours" not in text  # top=1
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(3)))
    assert snap.live_blocks(snap.load_snapshot(path)) == snap.live_blocks(_snapshot(3))
    path.write_bytes(pickle.dumps({"not": "a snapshot"}))
    with pytest.raises(ValueError, match="_dump_snapshot"):
        snap.load_snapshot(path)


def test_frames_from_the_profiler_are_parsed_and_filtered() -> None:
    frame = snap.SnapshotFrame.from_dict(_frame("none", 0, "/home/me/train.py(12): train"))
    assert (frame.filename, frame.line, frame.name, frame.exact) == (USER, 12, "train", False)
    assert frame.is_user and str(frame) == "train.py in train"
    for name in ("torch/nn/modules/conv.py(546): _conv_forward", "contextlib.py(141): __enter__",
                 "<built-in method conv2d of type object at 0x1>", "nn.Module: Conv2d_0",
                 "IPython/core/interactiveshell.py(3577): run_code"):
        assert not snap.SnapshotFrame.from_dict(_frame("none", 0, name)).is_user, name
    assert snap.SnapshotFrame("/tmp/ipykernel_42/123.py", 3, "<module>").is_user  # a notebook cell


def _leaky_eval(model, batches, prof, keep):
    total = 0
    for x in prof.watch(batches):
        total = total + model(x).sum()  # keeps every batch's graph, and its activations
    keep.append(total)


def test_a_leak_found_in_the_profilers_snapshot_on_a_cpu() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    batches = [torch.randn(32, 64) for _ in range(5)]
    keep: list = []
    with MemoryProfile() as prof:
        _leaky_eval(model, batches, prof, keep)
    top = snap.sites(prof.snapshot())[0]
    assert [f.name for f in top.frames[:1]] == ["_leaky_eval"]
    # per step the ReLU's output (32 x 256 float32) stays: ReLU's backward and the second Linear's
    # both saved it (the first Linear's output is freed once the ReLU has read it)
    assert (top.nbytes, top.blocks, top.largest) == (5 * 32 * 256 * 4, 5, 32 * 256 * 4)


@pytest.mark.gpu
def test_memory_history_finds_a_cuda_leak(tmp_path) -> None:
    keep = []
    with snap.MemoryHistory(max_entries=10_000) as history:
        before = history.snapshot()
        for _ in range(4):
            keep.append(torch.empty(2**18, device="cuda"))  # 1 MiB per step
        after = history.snapshot()
        path = history.dump(tmp_path / "leak.pickle")
    grown = snap.grown_sites(before, after)
    assert grown[0].nbytes == 4 * 2**20 and grown[0].frames[0].name == "test_memory_history_finds_a_cuda_leak"
    assert snap.live_blocks(snap.load_snapshot(path))
    assert snap.timeline(after)[-1] - snap.timeline(after)[0] >= 3 * 2**20


def test_memory_history_without_cuda_names_the_cpu_route() -> None:
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    with pytest.raises(RuntimeError, match="MemoryProfile"):
        with snap.MemoryHistory():
            pass
    with pytest.raises(ValueError, match="stacks"):
        snap.MemoryHistory(stacks="cpp")
