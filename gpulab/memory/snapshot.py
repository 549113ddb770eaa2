"""The memory snapshot: PyTorch's record of every live block and the stack that allocated it.

PyTorch's own tool for "what holds the GPU's memory, and which line allocated it" is the CUDA
memory snapshot (PyTorch docs, "Understanding CUDA Memory Usage",
https://pytorch.org/docs/stable/torch_cuda_memory.html)::

    torch.cuda.memory._record_memory_history(max_entries=100_000)   # start recording stacks
    run_your_code()
    torch.cuda.memory._dump_snapshot("snapshot.pickle")             # drop it on pytorch.org/memory_viz
    torch.cuda.memory._record_memory_history(enabled=None)          # stop

The pickled snapshot is a dict: ``segments`` (what the caching allocator holds from the driver),
each with ``blocks`` (``size``, ``requested_size``, ``address``, ``state``: ``active_allocated``
for a live tensor, and ``frames``: ``filename`` / ``line`` / ``name``, innermost first), and
``device_traces`` (the alloc/free history, one list per device). The viewer at
https://pytorch.org/memory_viz draws the history ("Active Memory Timeline"); this module reads
the same dict in Python, so a notebook can print the largest live blocks with their frames, and
the sites whose memory grew between two snapshots (a leak)::

    with MemoryHistory() as history:         # CUDA only; gpulab.memory.profiled is the CPU route
        before = history.snapshot()
        run_some_steps()
        after = history.snapshot()
        history.dump("leak.pickle")
    print(summarize(after))                   # live memory by the user frames that allocated it
    print(grown_sites(before, after)[0])      # the site whose memory grew: the leak

Every reader here is a pure function of the dict, so it also reads a snapshot that
:meth:`gpulab.memory.profiled.MemoryProfile.snapshot` builds from ``torch.profiler``'s memory
events on a CPU (whose frames carry ``name`` as ``"file.py(line): function"``).
"""

from __future__ import annotations

import linecache
import os
import pickle
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpulab.devices.meter_report import format_bytes
from gpulab.devices.physical import cuda_device_count

__all__ = ["MemoryHistory", "SnapshotFrame", "Block", "Site", "load_snapshot", "live_blocks", "sites",
           "grown_sites", "timeline", "summarize"]

_TORCH_DIR = os.path.dirname(torch.__file__).replace("\\", "/") + "/"
# torch.profiler names a Python frame "path/to/file.py(12): function"
_PROFILER_NAME = re.compile(r"^(?P<file>.+\.py)\((?P<line>\d+)\): (?P<name>.+)$")
# Frames that never answer "which line of yours": the instruments' own, and the notebook's machinery
_INSTRUMENTS = tuple(f"gpulab/memory/{f}.py" for f in ("attribution", "meter", "threads", "ledger", "origins",
                                                        "leaks", "profiled", "snapshot"))
_FRAMEWORKS = ("IPython", "ipykernel", "tornado", "traitlets", "jupyter_client", "zmq", "_pytest", "pytest",
               "pluggy", "nbclient")


@dataclass(frozen=True)
class SnapshotFrame:
    """One frame of a block's stack."""

    filename: str
    line: int
    name: str
    exact: bool = True  # False for a profiler-built frame: its line is where the function was entered

    @classmethod
    def from_dict(cls, frame: dict[str, Any]) -> "SnapshotFrame":
        """A snapshot's frame dict; a profiler-built one (``filename == "none"``) is parsed from its name."""
        filename, line, name = str(frame.get("filename", "")), int(frame.get("line", 0)), str(frame.get("name", ""))
        parsed = _PROFILER_NAME.match(name) if filename in ("none", "") else None
        if parsed:
            return cls(parsed["file"], int(parsed["line"]), parsed["name"], exact=False)
        return cls(filename, line, name)

    @property
    def is_user(self) -> bool:
        """A Python frame of your code: not torch's, the standard library's, a C++ frame, the
        instruments' or the notebook machinery's."""
        path = self.filename.replace("\\", "/")
        if not path.endswith(".py"):
            return False  # C++ frames (stacks="all"), "<built-in method ...>", "nn.Module: Conv2d_0"
        if path.startswith(("torch/", _TORCH_DIR)) or re.search(r"(site|dist)-packages/torch/", path):
            return False
        if path.endswith(_INSTRUMENTS):
            return False
        if re.search(r"(site|dist)-packages/(" + "|".join(_FRAMEWORKS) + ")/", path):
            return False
        top = path.split("/")[0].removesuffix(".py")
        if not os.path.isabs(path) and (top in sys.stdlib_module_names or top in _FRAMEWORKS):
            return False  # the profiler shortens paths on sys.path: "contextlib.py", "IPython/core/..."
        stdlib = os.path.dirname(os.__file__).replace("\\", "/") + "/"
        return not (path.startswith(stdlib) and "-packages/" not in path)

    def __str__(self) -> str:
        name = "cell" if "ipykernel" in self.filename else os.path.basename(self.filename)
        if not self.exact:
            return f"{name} in {self.name}"
        code = linecache.getline(self.filename, self.line).strip() if self.line else ""
        return f"{name}:{self.line} in {self.name}" + (f": {code.split('  # ')[0].rstrip()}" if code else "")


@dataclass(frozen=True)
class Block:
    """A block of a snapshot's segment (``state == "active_allocated"``: a live tensor's memory)."""

    size: int
    requested_size: int
    address: int | None
    device: int
    state: str
    frames: tuple[SnapshotFrame, ...]  # innermost first

    def user_frames(self) -> tuple[SnapshotFrame, ...]:
        """The frames of your code, innermost first."""
        return tuple(f for f in self.frames if f.is_user)


@dataclass(frozen=True)
class Site:
    """Live blocks grouped by the user frames that allocated them."""

    frames: tuple[SnapshotFrame, ...]  # innermost first; () when no Python frame was recorded
    nbytes: int
    blocks: int
    largest: int

    def __str__(self) -> str:
        where = "\n      <- ".join(str(f) for f in self.frames) or "(no frame of yours: made before recording began, or by C++/autograd)"
        return f"{format_bytes(self.nbytes):>11} in {self.blocks:>4} blocks (largest {format_bytes(self.largest)})  {where}"


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a pickled snapshot (``torch.cuda.memory._dump_snapshot``'s file).

    Warning:
        A pickle runs code when it is loaded: only load snapshots you made yourself.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a snapshot (no ``segments``).
    """
    with open(path, "rb") as f:
        data = pickle.load(f)  # see the Warning
    if isinstance(data, list):  # old files held the segments only (torch's _memory_viz reads them too)
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        raise ValueError(f"{path} is not a memory snapshot (a dict with 'segments'): write one with "
                         "torch.cuda.memory._dump_snapshot(path) or MemoryHistory.dump(path)")
    return data


def live_blocks(snapshot: dict[str, Any], device: int | None = None) -> list[Block]:
    """The blocks in use by live tensors (``active_allocated``), largest first."""
    out = []
    for segment in snapshot.get("segments", []):
        dev = int(segment.get("device", 0))
        if device is not None and dev != device:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            frames = tuple(SnapshotFrame.from_dict(f) for f in block.get("frames", []))
            out.append(Block(int(block["size"]), int(block.get("requested_size", block["size"])),
                             block.get("address"), dev, block["state"], frames))
    return sorted(out, key=lambda b: b.size, reverse=True)


def sites(snapshot: dict[str, Any], depth: int = 2, device: int | None = None) -> list[Site]:
    """Live memory grouped by the innermost ``depth`` user frames that allocated it, largest first.

    ``depth=2`` usually gives "the model code, called from this line of the loop".
    """
    if depth < 1:
        raise ValueError(f"depth is how many of your frames name a site: at least 1, got {depth}")
    groups: dict[tuple[SnapshotFrame, ...], list[Block]] = {}
    for block in live_blocks(snapshot, device):
        groups.setdefault(block.user_frames()[:depth], []).append(block)
    out = [Site(key, sum(b.size for b in blocks), len(blocks), max(b.size for b in blocks))
           for key, blocks in groups.items()]
    return sorted(out, key=lambda s: s.nbytes, reverse=True)


def grown_sites(before: dict[str, Any], after: dict[str, Any], depth: int = 2,
                device: int | None = None) -> list[Site]:
    """Sites holding more live memory in ``after`` than in ``before``, by how much they grew.

    A leak is a site that grows between two snapshots taken some steps apart; each returned
    :class:`Site` counts only the growth (bytes and blocks added).
    """
    old = {s.frames: s for s in sites(before, depth, device)}
    out = []
    for site in sites(after, depth, device):
        prev = old.get(site.frames)
        grown = site.nbytes - (prev.nbytes if prev else 0)
        if grown > 0:
            out.append(Site(site.frames, grown, site.blocks - (prev.blocks if prev else 0), site.largest))
    return sorted(out, key=lambda s: s.nbytes, reverse=True)


def timeline(snapshot: dict[str, Any], device: int = 0) -> list[int]:
    """Bytes allocated after each event of the recorded history, from its start (what the viewer's
    "Active Memory Timeline" draws): ``alloc`` adds, ``free_completed`` subtracts."""
    traces = snapshot.get("device_traces", [])
    if device >= len(traces):
        return []
    level, out = 0, []
    for entry in traces[device]:
        if entry.get("action") == "alloc":
            level += int(entry["size"])
        elif entry.get("action") == "free_completed":
            level -= int(entry["size"])
        else:
            continue
        out.append(level)
    return out


def summarize(snapshot: dict[str, Any], top: int = 5, depth: int = 2, device: int | None = None) -> str:
    """A text table: live bytes, then the ``top`` sites holding most of them with their frames."""
    blocks = live_blocks(snapshot, device)
    total = sum(b.size for b in blocks)
    out = [f"snapshot: {format_bytes(total)} live in {len(blocks)} blocks; by the frames that allocated them:"]
    out.extend(str(s) for s in sites(snapshot, depth, device)[:top])
    return "\n".join(out)


class MemoryHistory:
    """Record the CUDA allocator's history with stack traces, then snapshot or dump it.

    Wraps ``torch.cuda.memory._record_memory_history`` (underscored, but documented on
    "Understanding CUDA Memory Usage"): each alloc/free is kept with its stack, at about 2 us per
    event (torch's docstring), up to ``max_entries`` events (older ones are overwritten).

    Args:
        max_entries: events kept (each several KB: a long run needs a bound).
        stacks: ``"python"`` (Python frames only, lighter) or ``"all"`` (C++ frames too).
        device: the GPU whose snapshot :meth:`snapshot` returns (default: the current one).

    Raises:
        RuntimeError: on entering without CUDA (on a CPU use
            :class:`gpulab.memory.profiled.MemoryProfile`, whose ``snapshot()`` reads the same way).
    """

    def __init__(self, max_entries: int = 100_000, stacks: str = "python", device: Any = None) -> None:
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
        if not (isinstance(max_entries, int) and max_entries > 0):
            raise ValueError(f"max_entries must be a positive int (e.g. 100_000), got {max_entries!r}")
        self.max_entries, self.stacks, self.device = max_entries, stacks, device
        self._active = False

    def __enter__(self) -> "MemoryHistory":
        if not cuda_device_count() or not torch.cuda.is_available():
            raise RuntimeError("MemoryHistory records the CUDA caching allocator, and this machine has no usable "
                               "GPU; on a CPU use gpulab.memory.profiled.MemoryProfile (torch.profiler with "
                               "profile_memory=True), whose snapshot() reads the same way")
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=self.stacks,
                                                 max_entries=self.max_entries)
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        torch.cuda.memory._record_memory_history(enabled=None)  # stop: recording costs time and memory

    def _check(self, what: str) -> None:
        if not self._active:
            raise RuntimeError(f"{what}() while not recording: call it inside `with MemoryHistory() as history:`")

    def snapshot(self) -> dict[str, Any]:
        """The snapshot now (``torch.cuda.memory._snapshot``): live blocks and the history so far."""
        self._check("snapshot")
        return torch.cuda.memory._snapshot(self.device)

    def dump(self, path: str | Path) -> Path:
        """Write the snapshot as a pickle (``torch.cuda.memory._dump_snapshot``); drop the file on
        https://pytorch.org/memory_viz (it is read in your browser, never uploaded)."""
        self._check("dump")
        path = Path(path)
        torch.cuda.memory._dump_snapshot(str(path))
        return path
