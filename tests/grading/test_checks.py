"""gpulab.grading: checks pass on right answers, fail with student-facing messages otherwise."""

from __future__ import annotations

import threading

import pytest
import torch

from gpulab import grading
from gpulab.grading import GradingError


def reference_double(x):
    return 2 * x


class ReferenceEcho:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        yield from range(self.n)


def test_grading_error_is_an_assertion_error() -> None:
    assert issubclass(GradingError, AssertionError)


def test_check_and_hint() -> None:
    grading.check(True, "fine")
    with pytest.raises(GradingError, match=r"the sum: check failed\n  Hint: add them"):
        grading.check(False, "the sum", hint="add them")


def test_check_close_reports_shape_dtype_and_values() -> None:
    x = torch.ones(2, 3)
    grading.check_close(x.clone(), x, what="ones")
    with pytest.raises(GradingError, match=r"shape \(3, 2\) but expected \(2, 3\)"):
        grading.check_close(torch.ones(3, 2), x, what="t")
    with pytest.raises(GradingError, match="dtype torch.float64"):
        grading.check_close(x.double(), x, what="t")
    with pytest.raises(GradingError, match="values differ"):
        grading.check_close(x + 1e-2, x, what="t")
    with pytest.raises(GradingError, match="expected a torch.Tensor, got list"):
        grading.check_close([1.0], x, what="t")
    grading.check_close(1.0 + 1e-9, 1.0, what="floats")


def test_check_equal_shape_between() -> None:
    grading.check_equal([1, 2], [1, 2], what="list")
    with pytest.raises(GradingError, match=r"expected 'nccl', got 'gloo'"):
        grading.check_equal("gloo", "nccl", what="backend")
    with pytest.raises(GradingError, match="shape"):
        grading.check_shape(torch.ones(2), (3,), what="t")
    grading.check_between(0.5, 0, 1, what="fraction")
    with pytest.raises(GradingError, match="below the minimum"):
        grading.check_between(-1, 0, 1, what="fraction")
    with pytest.raises(GradingError, match="NaN"):
        grading.check_between(float("nan"), 0, 1, what="fraction")


def test_check_ratio() -> None:
    assert grading.check_ratio(300.0, 100.0, at_least=2, what="throughput") is None  # no Out[] in a test cell
    with pytest.raises(GradingError, match=r"ratio 1.50x, needs at least 2.00x"):
        grading.check_ratio(150.0, 100.0, at_least=2, what="throughput")
    with pytest.raises(GradingError, match="at most"):
        grading.check_ratio(3.0, 1.0, at_most=1.25, what="imbalance")
    with pytest.raises(GradingError, match="baseline must be positive"):
        grading.check_ratio(1.0, 0.0, at_least=1, what="x")


def test_check_raises() -> None:
    assert grading.check_raises(ValueError, int, "x", what="int('x')") is None  # no Out[] holding an exception
    err = grading.catch(ValueError, int, "x", what="int('x')")
    assert isinstance(err, ValueError)
    with pytest.raises(GradingError, match="nothing was raised"):
        grading.check_raises(ValueError, int, "3", what="int('3')")
    with pytest.raises(GradingError, match="expected ValueError, got ZeroDivisionError"):
        grading.check_raises(ValueError, lambda: 1 / 0, what="div")
    with pytest.raises(GradingError, match="does not mention"):
        grading.check_raises(ValueError, int, "x", what="int", match="world_size")


def test_check_not_calling_catches_direct_aliased_and_threaded_calls() -> None:
    def honest(x):
        return x + x

    def direct(x):
        return reference_double(x)

    alias = reference_double

    def aliased(x):
        return alias(x)

    def threaded(x):
        out = []
        t = threading.Thread(target=lambda: out.append(reference_double(x)))
        t.start()
        t.join()
        return out[0]

    assert grading.check_not_calling(honest, 3, forbidden=[reference_double]) == 6
    for cheat in (direct, aliased, threaded):
        with pytest.raises(GradingError, match="calls gpulab's reference .*reference_double"):
            grading.check_not_calling(cheat, 3, forbidden=[reference_double])


def test_check_not_calling_covers_class_methods() -> None:
    def wraps(n):
        return list(ReferenceEcho(n))

    with pytest.raises(GradingError, match="ReferenceEcho"):
        grading.check_not_calling(wraps, 2, forbidden=[ReferenceEcho])
    assert grading.check_not_calling(lambda n: list(range(n)), 2, forbidden=[ReferenceEcho]) == [0, 1]


def test_a_student_dataset_is_not_taken_for_a_reference_dataset() -> None:
    """A reference that is a torch Dataset (a typing.Generic) forbids its own methods, not Generic's,
    which every student Dataset shares (defining or subscripting one ran Generic's code)."""
    from torch.utils.data import Dataset

    class ReferenceCache(Dataset):
        def __getitem__(self, i):
            return i

    def student():
        class Mine(Dataset):  # runs Generic.__init_subclass__
            def __getitem__(self, i):
                return 2 * i

        return Mine()[3], Dataset[int]  # and Generic.__class_getitem__

    assert grading.check_not_calling(student, forbidden=[ReferenceCache])[0] == 6
    with pytest.raises(GradingError, match="ReferenceCache"):
        grading.check_not_calling(lambda: ReferenceCache()[1], forbidden=[ReferenceCache])


def test_check_not_calling_restores_the_profiler() -> None:
    import sys

    with pytest.raises(ZeroDivisionError):
        grading.check_not_calling(lambda: 1 / 0, forbidden=[reference_double])
    assert sys.getprofile() is None


def test_compare_speed_orders_a_slow_and_a_fast_callable() -> None:
    big = torch.randn(200, 200)
    slow = lambda: [big @ big for _ in range(20)]  # noqa: E731
    fast = lambda: big @ big  # noqa: E731
    cmp = grading.compare_speed(slow, fast, repeats=3)
    assert cmp.speedup > 2
    assert "speedup" in str(cmp)
    with pytest.raises(ValueError):
        grading.compare_speed(slow, fast, repeats=0)


def test_a_contextmanager_in_a_reference_does_not_forbid_every_contextmanager() -> None:
    """@contextmanager wraps every generator in contextlib's one ``helper`` function: a reference with a
    ``no_sync()`` context manager forbids its own generator, not contextlib's shared wrapper."""
    from contextlib import contextmanager

    class ReferenceWrapper:
        @contextmanager
        def no_sync(self):
            yield "reference"

    def student():
        @contextmanager
        def mine():
            yield 2

        with mine() as v:
            return v

    assert grading.check_not_calling(student, forbidden=[ReferenceWrapper]) == 2
    with pytest.raises(GradingError, match="ReferenceWrapper"):
        grading.check_not_calling(lambda: ReferenceWrapper().no_sync().__enter__(), forbidden=[ReferenceWrapper])
