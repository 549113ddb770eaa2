"""What :func:`gpulab.parallel.launcher.launch` raises when ranks fail, and which rank it blames.

When one rank fails, the others fail soon after: a rank waiting in a collective gets "Connection
closed by peer" once its partner has gone. Only the first failure is the cause, and :func:`blame`
finds it **by cause, not by clock**: a rank whose collective or store call failed because a peer
vanished (:func:`peer_lost`) is a consequence; a rank that raised in its own code, or died without
reporting (killed by the kernel's OOM killer, a crash in C++, ``os._exit``), is a cause. Time only
orders failures of the same kind. Why not time alone: a rank that dies without a word cannot stamp
its own death, so the parent stamps it when it notices, which on a busy machine can be after the
surviving rank stamped the error that the death caused (3 runs in 27 blamed the wrong rank so).

:class:`RankFailedError` keeps the failing rank's exception type. Where that type can be
subclassed, the error raised is an instance of **both** ``RankFailedError`` and the original type,
so ``except ValueError`` and ``except torch.OutOfMemoryError`` work around :func:`launch` as they
would around a single-process call. Otherwise (a class defined inside a function, so it cannot be
sent back; a ``SystemExit`` or ``KeyboardInterrupt``, which must not stop the caller's
interpreter) it is a plain ``RankFailedError`` and ``exc_class``/``exc_type`` say what it was.
"""

from __future__ import annotations

import functools
import pickle
import re
from typing import Any, Sequence

__all__ = ["RankFailedError", "LaunchTimeoutError", "blame", "peer_lost", "summary"]

# How a collective or store call reports that the other side went away (gloo raises a plain
# RuntimeError with the first marker; the TCPStore raises DistNetworkError; NCCL aborts the comm).
PEER_LOST_MARKERS = (
    "Connection closed by peer", "Connection reset by peer", "Connection was likely closed",
    "Broken pipe", "remote worker crashing", "NCCL communicator was aborted", "ncclRemoteError",
)
SUMMARY_CHARS = 200  # the "(then: ...)" line keeps whole sentences up to about this length


def peer_lost(err: BaseException) -> bool:
    """Did ``err`` (or an exception it was raised from, or while handling) come from a vanished peer?

    True for torch.distributed's own errors (``DistError``: backend, network and store errors) and
    for messages that say the connection was closed or reset.
    """
    try:
        from torch.distributed import DistError
    except ImportError:  # a torch built without distributed
        DistError = ()
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        try:
            text = str(err)
        except Exception:  # a broken __str__ must not stop the rank from reporting
            text = ""
        if isinstance(err, DistError) or any(m in text for m in PEER_LOST_MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return False


def blame(failures: Sequence[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    """The failures ``(rank, record)`` ordered cause first: own errors and deaths, then peer losses.

    A record has ``"time"`` (``time.time()`` when the error was raised, or when the parent saw the
    process end) and ``"peer_lost"`` (missing for a process that died without reporting).
    """
    return sorted(failures, key=lambda f: (bool(f[1].get("peer_lost")), f[1]["time"]))


def summary(message: str | None, limit: int = SUMMARY_CHARS) -> str:
    """The first line of ``message``, shortened only between sentences (never mid-sentence).

    Whole sentences are kept while they fit in ``limit`` characters, and the first sentence always
    is, however long: a cut one ("This is typically caused by a remote worker ") misleads.
    """
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    first = lines[0]
    more = len(lines) > 1
    if len(first) > limit:
        # a sentence ends at . ! or ? followed by a space; "pair.cc:553" or "3.5" are not ends
        ends = [m.end(1) for m in re.finditer(r"([.!?])\s", first)]
        cut = max((e for e in ends if e <= limit), default=ends[0] if ends else len(first))
        more = more or cut < len(first)
        first = first[:cut]
    return first + (" [...]" if more else "")


class RankFailedError(RuntimeError):
    """A rank raised (or died). ``rank``, ``exc_type`` and ``remote_traceback`` say which and why.

    Attributes:
        rank: the rank blamed (the first to fail by cause, see :func:`blame`).
        world_size: the number of ranks launched.
        exc_type: the name of the rank's exception type (``"ProcessDied"`` if it died silently).
        exc_class: the rank's exception class itself, or None when it could not be sent back.
        message: the rank's exception message.
        remote_traceback: the traceback printed in the rank.
        others: one line per later failure, each a consequence of the first.

    Where ``exc_class`` can be subclassed, :func:`launch` raises an instance of a subclass of both
    ``RankFailedError`` and ``exc_class``: catch ``ValueError`` or ``RankFailedError``, as you wish.
    """

    def __init__(self, rank: int, world_size: int, exc_type: str, message: str, remote_traceback: str,
                 others: Sequence[str] = (), exc_class: type[BaseException] | None = None):
        self.rank, self.world_size, self.exc_type, self.exc_class = rank, world_size, exc_type, exc_class
        self.message, self.remote_traceback, self.others = message, remote_traceback, tuple(others)
        text = f"rank {rank} of {world_size} failed with {exc_type}: {message}"
        if "Cannot re-initialize CUDA in forked subprocess" in remote_traceback:
            text += ("\n  Hint: this rank used CUDA but was forked; pass start_method='spawn' (fn must then live "
                     "in a .py file), or use backend='nccl'/'auto' so launch() picks the start method")
        if others:
            text += "\n  (then: " + "; ".join(others) + ")"
        self._text = f"{text}\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        # BaseException's own __init__, not the original class's: its __init__ may want other
        # arguments (or have side effects), and it already ran in the rank.
        BaseException.__init__(self, self._text)

    def __str__(self) -> str:  # first in the MRO: KeyError would show repr(message), OSError its errno
        return self._text

    def __reduce__(self):  # the combined classes are made at run time: rebuild through the factory
        return (rank_failed_error, (self.rank, self.world_size, self.exc_type, self.message,
                                    self.remote_traceback, self.others, self.exc_class))


@functools.lru_cache(maxsize=None)
def _with_type(cls: type[BaseException]) -> type[RankFailedError] | None:
    """A subclass of RankFailedError and ``cls`` (one per ``cls``), or None where that cannot be."""
    if not issubclass(cls, Exception) or issubclass(RankFailedError, cls) or issubclass(cls, RankFailedError):
        return None  # SystemExit/KeyboardInterrupt would stop the caller; RuntimeError/Exception: already one
    try:
        return type(f"RankFailed{cls.__name__}", (RankFailedError, cls),
                    {"__module__": __name__, "__doc__": f"A rank raised {cls.__qualname__}: see RankFailedError."})
    except TypeError:  # a final class, a layout conflict, or an __init_subclass__ that refuses us
        return None


def rank_failed_error(rank: int, world_size: int, exc_type: str, message: str, remote_traceback: str,
                      others: Sequence[str] = (), exc_class: type[BaseException] | None = None) -> RankFailedError:
    """A :class:`RankFailedError` that is also an instance of ``exc_class`` where that can be."""
    combined = _with_type(exc_class) if exc_class is not None else None
    if combined is not None:
        try:
            # the original class's __new__: RuntimeError's (first in the MRO) refuses an OSError layout
            err = exc_class.__new__(combined, message)
            RankFailedError.__init__(err, rank, world_size, exc_type, message, remote_traceback, others, exc_class)
            return err
        except Exception:  # a __new__ that wants other arguments: fall back below
            pass
    return RankFailedError(rank, world_size, exc_type, message, remote_traceback, others, exc_class)


def class_blob(cls: type[BaseException]) -> bytes | None:
    """Rank side: ``cls`` pickled by reference, or None if the parent could not find it by name."""
    try:
        blob = pickle.dumps(cls)
        return blob if pickle.loads(blob) is cls else None
    except Exception:  # a class defined in a function, or one with an odd __reduce__
        return None


def class_from_blob(blob: bytes | None) -> type[BaseException] | None:
    """Parent side: the class back, or None (a spawned rank's class this process cannot import)."""
    if blob is None:
        return None
    try:
        cls = pickle.loads(blob)
    except Exception:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


class LaunchTimeoutError(TimeoutError):
    """Ranks were still running when the timeout passed; ``stacks`` maps rank -> where it waited."""

    def __init__(self, ranks: list[int], world_size: int, timeout: float, stacks: dict[int, str]):
        self.ranks, self.stacks = ranks, stacks
        where = "".join(f"\n--- rank {r} was at ---\n{stacks.get(r, '(no stack dumped)').rstrip()}" for r in ranks)
        super().__init__(
            f"ranks {ranks} of {world_size} were still running after timeout={timeout:g}s and were stopped. "
            "A collective (all_reduce, barrier, broadcast...) waits until every rank calls it, so a rank "
            "that skips one, or calls them in another order, hangs the others: check that all ranks run "
            "the same collectives in the same order (or raise timeout= if the work is just long)." + where)
