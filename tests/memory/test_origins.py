"""gpulab.memory.origins: views and in-place results are not new tensors, and tracing is bounded."""

from __future__ import annotations

import torch

from gpulab.memory import LeakFinder


def test_views_and_in_place_results_are_not_new_tensors() -> None:
    with LeakFinder() as finder:
        x = torch.empty(100)
        finder.step()
        views = [x.view(10, 10), x[3:], x.t()]
        x.add_(1)
        finder.step()
        finder.step()
    survivors = finder.survivors()
    assert [(s.shape, s.nbytes, s.step) for s in survivors] == [((100,), 400, 0)]
    del views


def test_tracing_is_bounded() -> None:
    keep = []
    with LeakFinder(max_records=5) as finder:
        for _ in range(3):
            keep.extend(torch.empty(10) for _ in range(4))
            finder.step()
    assert len(finder._tracer.records) == 5 and finder._tracer.dropped == 7
    assert "not traced" in str(finder.report())


def test_an_op_on_a_thread_without_python_frames_has_an_empty_stack() -> None:
    """On a GPU, backward's ops reach the tracer from autograd's C++ worker thread, where the Python
    stack holds only the tracer's own frames (seen on an H200: lab 08 raised 'call stack is not
    deep enough'). A thread started from C with one Python frame above ``_stack`` is the same case."""
    import _thread
    import threading

    from gpulab.memory.origins import OriginTracer

    tracer, out, done = OriginTracer(), [], threading.Event()
    _thread.start_new_thread(lambda: (out.append(tracer._stack()), done.set()), ())
    assert done.wait(10), "the thread raised instead of returning a stack"
    assert out == [()]
