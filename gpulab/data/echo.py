"""``BatchEcho``: reuse each batch ``factor`` times when the input pipeline cannot keep up.

Data echoing (D. Choi, A. Passos, C. J. Shallue, G. E. Dahl, "Faster Neural Network Training with
Data Echoing", 2019, arXiv:1907.05550): when the stages before the model are slower than the model,
repeat data that is already prepared instead of leaving the accelerator idle. *Batch* echoing
repeats whole batches after batching (the cheapest place: nothing upstream runs again). The cost
is **less randomness** (the comment below the imports): echo only when the profile says the loop
is data-bound, and by no more than the ratio *time to prepare a batch / time the device needs for it*.

    .venv/bin/python -m pytest tests/data/test_echo.py
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

# The cost is less randomness: the ``factor`` steps on one batch see the same examples with the
# same augmentation, so consecutive gradients are correlated and each step carries less new
# information. Choi et al. find that echoing can still reduce the time to a target quality, and that
# echoing earlier in the pipeline (before augmentation and shuffling) keeps more diversity; with too
# large a factor the model starts to overfit the repeated data and the benefit turns into a loss.

__all__ = ["BatchEcho"]


class BatchEcho:
    """Yield every batch of ``loader`` ``factor`` times in a row.

    Args:
        loader: any iterable of batches (re-iterated each epoch).
        factor: how many times each batch is used (1 = no echoing).

    Raises:
        ValueError: if ``factor`` is not an int >= 1.

    Warning:
        The same batch object is yielded each time: a step that modifies its batch in place changes
        what the next echo sees. Clone first if you must.
    """

    def __init__(self, loader: Iterable, factor: int) -> None:
        if isinstance(factor, bool) or not isinstance(factor, int):
            raise ValueError(f"the echo factor must be an int >= 1 (1 means no echoing), got {factor!r}")
        if factor < 1:
            raise ValueError(f"the echo factor must be >= 1 (1 means no echoing); {factor} would drop batches")
        self.loader = loader
        self.factor = factor

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            for _ in range(self.factor):
                yield batch

    def __len__(self) -> int:
        return len(self.loader) * self.factor  # type: ignore[arg-type]

    @property
    def num_workers(self) -> int | None:
        """The wrapped loader's ``num_workers`` (profilers read it for their advice)."""
        return getattr(self.loader, "num_workers", None)

    def __repr__(self) -> str:
        return f"BatchEcho({self.loader!r}, factor={self.factor})"
