"""Following threads: a MemoryMeter must see the work done in threads it did not start.

A dispatch mode is thread-local: a :class:`~gpulab.devices.MemoryMeter` entered in the main thread
sees nothing that DataParallel's replica threads do. And one mode instance must not be entered in
several threads at once (its stack bookkeeping is per instance). So, while any meter is active,
this module makes every thread that starts, and every task submitted to a
``concurrent.futures.ThreadPoolExecutor``, run inside a *new* mode instance of each active meter.
The instances share their meter's bookkeeping, under the registry's lock.

That covers ``torch.nn.parallel.parallel_apply``, gpulab's own DataParallel, and the plain
``threading.Thread`` or ``ThreadPoolExecutor`` code students write in lab 04, including a pool
created before the meter (its tasks are wrapped at ``submit``).

How: ``threading.Thread.start`` and ``ThreadPoolExecutor.submit`` are replaced while at least one
meter is active, and put back when the last one exits. The replacement wraps the thread's
``run`` (or the task) so that it enters the modes first and leaves them when it returns; a thread
still running after its meter exited keeps an inert mode that passes every op straight through.

Warning:
    Threads that were already running before the meter was entered, other than pool tasks
    submitted afterwards (e.g. a ``multiprocessing.pool.ThreadPool`` made earlier), are not
    followed. Autograd's backward on the CPU runs in the calling thread, so it is followed; on CUDA,
    autograd's device threads inherit the caller's modes from torch itself.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

__all__ = ["follow", "following"]

_lock = threading.Lock()
_meters: list[Any] = []  # the active meters, outermost first
_saved: dict[str, Callable] = {}  # what was there before we patched (never cleared: in-flight calls use it)


def following() -> tuple[Any, ...]:
    """The meters that new threads and pool tasks follow now."""
    return tuple(_meters)


def follow(meter: Any) -> None:
    """Make threads started (and pool tasks submitted) from now on run inside ``meter`` too."""
    with _lock:
        if not _meters:
            _saved["start"] = threading.Thread.start
            _saved["submit"] = ThreadPoolExecutor.submit
            threading.Thread.start = _start  # type: ignore[method-assign]
            ThreadPoolExecutor.submit = _submit  # type: ignore[method-assign]
        _meters.append(meter)


def _unfollow(meter: Any) -> None:
    """Stop following for ``meter``; the last one out puts ``start`` and ``submit`` back."""
    with _lock:
        if meter in _meters:
            _meters.remove(meter)
        if not _meters:
            # Put back only what is still ours: if someone patched on top, leave theirs (ours is
            # inert with no active meter).
            if threading.Thread.start is _start:
                threading.Thread.start = _saved["start"]  # type: ignore[method-assign]
            if ThreadPoolExecutor.submit is _submit:
                ThreadPoolExecutor.submit = _saved["submit"]  # type: ignore[method-assign]


def _wrap(fn: Callable, meters: tuple[Any, ...]) -> Callable:
    def followed(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for meter in meters:  # outermost first, so the modes stack as in the parent thread
                meter._follow_here(stack)
            return fn(*args, **kwargs)

    followed.__wrapped__ = fn  # type: ignore[attr-defined]
    return followed


def _start(self: threading.Thread) -> None:
    meters = following()
    if meters and not getattr(self, "_gpulab_followed", False):
        self._gpulab_followed = True  # type: ignore[attr-defined]
        self.run = _wrap(self.run, meters)  # type: ignore[method-assign]  # an instance attribute: subclasses too
    return _saved["start"](self)


def _submit(self: ThreadPoolExecutor, fn: Callable, /, *args: Any, **kwargs: Any):
    meters = following()
    return _saved["submit"](self, _wrap(fn, meters) if meters else fn, *args, **kwargs)
