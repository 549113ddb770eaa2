"""CUDA GPUs on paper, so that a CPU-only machine can find the device bugs of GPU code.

Every tensor stays a real CPU tensor with real values, and a ledger keeps the device each storage
would live on. A dispatch mode checks every operation as CUDA does: all tensor arguments on one
device (a 0-dim CPU tensor may join any device, as a scalar), copies excepted; the result lives on
that device, or on the ``device=`` of a factory. Python code asking ``Tensor.device``, ``is_cuda``,
``.to``, ``.cpu()`` or ``.numpy()`` gets the ledger's answer, and ``torch.cuda`` answers as a CUDA
build with ``num_gpus`` GPUs. So ``model_on_cuda0(cpu_batch)`` raises the RuntimeError a GPU raises,
and ``loss.item()`` still gives a number.

Streams and events are host-side stand-ins. Kernels here run at once, on the CPU; work that a test
wants *queued*, as a GPU queues it, is added with :meth:`FakeCuda.launch`: it ends ``seconds`` later
and only ``synchronize`` (of the device, a stream or an event) or a copy to the host (``.cpu()``,
``.to("cpu")``) waits for it; ``copy_`` into a host tensor does not (a pinned, non-blocking copy).
Every wait is noted in ``FakeCuda.syncs``. An event records when
the work queued before it ends, so a timeline read from events measures the work, and a clock read
without a synchronisation measures the launch.

Why not torch's ``FakeTensorMode`` (checked with torch 2.13, CPU build): it makes fake ``cuda:1``
tensors and names device mismatches, but the first autograd node on a fake CUDA tensor aborts the
interpreter ("PyTorch is not linked with support for cuda devices"), and fake tensors have no
values (``.item()`` raises). Lab 07 trains, and its graders compare values.

Example::

    def test_a_model_on_the_gpu_needs_its_input_there():
        with FakeCuda(num_gpus=2):
            model = nn.Linear(3, 2).to("cuda:0")
            with pytest.raises(RuntimeError, match="cuda:0 and cpu"):
                model(torch.randn(4, 3))

Limits: every thread started inside the block checks its operations (its bootstrap is wrapped),
but a thread started before it does not; C++ code that reads a tensor's device sees the CPU
(autograd, for one, never complains); a cross-device ``copy_`` is always allowed; an op given
``device="cpu"`` and a tensor on a GPU is taken to run on that GPU (C++ passes the real device
on); the queues of two GPUs do not wait for each other (``Stream.wait_event`` does nothing).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any

import pytest
import torch
import torch._dynamo  # imported lazily by torch.nn's first call; it must not see the fake torch.cuda
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CPU = torch.device("cpu")
aten = torch.ops.aten

# copies may cross devices; their result lives on device= (or on the input's device)
_COPIES = {aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
           aten.detach.default, aten.alias.default}
# indexing a CUDA tensor with CPU indices is allowed: only the indexed tensor and the values are checked
_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


class FakeCuda:
    """Pretend ``num_gpus`` CUDA devices inside the ``with`` block (see the module docstring).

    Attributes:
        syncs: every ``torch.cuda.synchronize`` (and stream or event synchronize), as the device index.
    """

    def __init__(self, num_gpus: int = 2) -> None:
        self.num_gpus = num_gpus
        self.syncs: list[int] = []
        self._monkeypatch = pytest.MonkeyPatch()  # its own: leaving the block undoes these patches only
        self._ledger: dict[int, tuple[weakref.ref, torch.device]] = {}
        self._lock = threading.Lock()
        self._busy_until = dict.fromkeys(range(num_gpus), 0.0)  # host time when each GPU's queue drains
        self._local = threading.local()  # this thread's current device and streams, as CUDA keeps them
        self._default_streams = {i: _Stream(self, i, default=True) for i in range(num_gpus)}
        self._mode: _Checks | None = None

    # -- the ledger -----------------------------------------------------------------------------

    def device_of(self, tensor: torch.Tensor) -> torch.device:
        """Where ``tensor`` would live on a GPU machine."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return CPU
        entry = self._ledger.get(storage._cdata)
        return entry[1] if entry is not None and entry[0]() is storage else CPU

    def place(self, tensor: torch.Tensor, device: torch.device) -> None:
        """Record that ``tensor``'s storage (and every view of it) lives on ``device``."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = storage._cdata
        with self._lock:
            if device.type == "cpu":
                self._ledger.pop(key, None)
            else:
                self._ledger[key] = (weakref.ref(storage, lambda ref, k=key: self._forget(k, ref)), device)

    def _forget(self, key: int, ref: weakref.ref) -> None:
        with self._lock:
            if key in self._ledger and self._ledger[key][0] is ref:
                del self._ledger[key]

    def cuda(self, index: int | torch.device | str | None = None) -> torch.device:
        """``torch.device("cuda", index)`` checked against the GPUs there are (None: the current one)."""
        if index is None:
            index = self.current_device()
        device = torch.device(index) if not isinstance(index, int) else torch.device("cuda", index)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", self.current_device())
        if device.type == "cuda" and not 0 <= device.index < self.num_gpus:
            raise RuntimeError(f"CUDA error: invalid device ordinal ({device}, {self.num_gpus} fake GPUs)")
        return device

    # -- queued work ----------------------------------------------------------------------------

    def launch(self, seconds: float, device: int = 0) -> None:
        """Queue ``seconds`` of work on GPU ``device`` and return at once, as a kernel launch does."""
        now = time.perf_counter()
        self._busy_until[device] = max(self._busy_until[device], now) + seconds

    def _drain(self, device: int) -> None:
        self.syncs.append(device)
        wait = self._busy_until[device] - time.perf_counter()
        if wait > 0:
            time.sleep(wait)

    def current_device(self) -> int:
        return getattr(self._local, "device", 0)

    def _exchange_device(self, index: int) -> int:
        previous = self.current_device()
        if index >= 0:
            self._local.device = self.cuda(index).index
        return previous

    def _streams(self) -> dict[int, _Stream]:
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        return self._local.streams

    def current_stream(self, device: Any = None) -> _Stream:
        index = self.cuda(device).index
        return self._streams().get(index, self._default_streams[index])

    @contextlib.contextmanager
    def stream(self, stream: _Stream | None):
        if stream is None:
            yield
            return
        streams = self._streams()
        previous = streams.get(stream.index)
        streams[stream.index] = stream
        previous_device = self._exchange_device(stream.index)  # torch.cuda.stream also makes its device current
        try:
            yield
        finally:
            self._exchange_device(previous_device)
            if previous is None:
                streams.pop(stream.index, None)
            else:
                streams[stream.index] = previous

    # -- entering and leaving -------------------------------------------------------------------

    def __enter__(self) -> FakeCuda:
        self._patch_cuda()
        self._patch_tensors()
        fake = self
        original_bootstrap = threading.Thread._bootstrap_inner

        # Each thread needs a dispatch mode of its own, entered before anything else in the thread: the
        # device checks stand for the hardware, under any mode of the program (a MemoryMeter follows
        # threads by wrapping their run method, which runs inside this).
        def bootstrap(thread: threading.Thread) -> None:
            with _Checks(fake):
                original_bootstrap(thread)

        self._monkeypatch.setattr(threading.Thread, "_bootstrap_inner", bootstrap)
        self._mode = _Checks(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        self._monkeypatch.undo()

    def _patch_cuda(self) -> None:
        fake, n = self, self.num_gpus
        patches = {
            "_is_compiled": lambda: True, "is_available": lambda: True, "device_count": lambda: n,
            "is_initialized": lambda: True, "_lazy_init": lambda: None, "init": lambda: None,
            "current_device": fake.current_device, "_exchange_device": fake._exchange_device,
            "_maybe_exchange_device": fake._exchange_device,
            "set_device": lambda d: fake._exchange_device(fake.cuda(d).index),
            "synchronize": lambda device=None: fake._drain(fake.cuda(device).index),
            "current_stream": fake.current_stream,
            "default_stream": lambda device=None: fake._default_streams[fake.cuda(device).index],
            "stream": fake.stream, "Stream": lambda device=None, priority=0: _Stream(fake, fake.cuda(device).index),
            "Event": lambda enable_timing=False, blocking=False, interprocess=False: _Event(fake),
            "is_current_stream_capturing": lambda: False,
            "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
            "memory_allocated": lambda device=None: 0, "max_memory_allocated": lambda device=None: 0,
            "memory_reserved": lambda device=None: 2**20, "reset_peak_memory_stats": lambda device=None: None,
            "memory_stats": lambda device=None: {}, "empty_cache": lambda: None,
            "get_device_name": lambda device=None: "FakeCuda GPU", "get_device_capability": lambda device=None: (9, 0),
        }
        for name, value in patches.items():
            self._monkeypatch.setattr(torch.cuda, name, value)

    def _patch_tensors(self) -> None:
        fake = self
        original_to, original_deepcopy = torch.Tensor.to, torch.Tensor.__deepcopy__
        original_numpy, original_cpu = torch.Tensor.numpy, torch.Tensor.cpu

        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if args and isinstance(args[0], torch.Tensor):  # .to(other): other's device and dtype
                other, args = args[0], args[1:]
                device, dtype = fake.device_of(other), other.dtype
                non_blocking = kwargs.pop("non_blocking", args[0] if args else False)
                memory_format = kwargs.pop("memory_format", torch.preserve_format)
            else:
                copy = kwargs.pop("copy", False)  # _parse_to does not take it
                device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
                kwargs["copy"] = copy
            copy = kwargs.get("copy", False)
            memory_format = memory_format or torch.preserve_format
            here = fake.device_of(tensor)
            target = here if device is None else fake.cuda(device) if device.type == "cuda" else device
            if target == here:
                return original_to(tensor, dtype=dtype, non_blocking=non_blocking, copy=copy,
                                   memory_format=memory_format)
            return _Move.apply(tensor, fake, target, dtype, memory_format)

        def cpu(tensor: torch.Tensor, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
            if fake.device_of(tensor).type == "cpu":
                return original_cpu(tensor, memory_format=memory_format)
            return _Move.apply(tensor, fake, CPU, None, memory_format)

        def cuda(tensor: torch.Tensor, device: Any = None, non_blocking: bool = False,
                 memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
            return to(tensor, fake.cuda(device), non_blocking=non_blocking, memory_format=memory_format)

        def numpy(tensor: torch.Tensor, *, force: bool = False) -> Any:
            where = fake.device_of(tensor)
            if where.type != "cpu":
                raise TypeError(f"can't convert {where} device type tensor to numpy. Use Tensor.cpu() to copy the "
                                "tensor to host memory first.")
            return original_numpy(tensor, force=force)

        def deepcopy(tensor: torch.Tensor, memo: dict) -> torch.Tensor:
            copied = original_deepcopy(tensor, memo)
            fake.place(copied, fake.device_of(tensor))
            return copied

        def device(tensor: torch.Tensor) -> torch.device:
            return fake.device_of(tensor)

        original_tensor, original_as_tensor = torch.tensor, torch.as_tensor

        def factory(original):  # torch.tensor(..., device="cuda:1") builds on a CUDA backend this build lacks
            def build(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
                out = original(data, *args, **kwargs)
                return out if device is None else to(out, device)
            return build

        self._monkeypatch.setattr(torch, "tensor", factory(original_tensor))
        self._monkeypatch.setattr(torch, "as_tensor", factory(original_as_tensor))
        for name, value in {"to": to, "cpu": cpu, "cuda": cuda, "numpy": numpy, "__deepcopy__": deepcopy,
                            "device": property(device), "is_cuda": property(lambda t: device(t).type == "cuda"),
                            "get_device": lambda t: -1 if device(t).type == "cpu" else device(t).index,
                            "record_stream": lambda t, stream: None}.items():
            self._monkeypatch.setattr(torch.Tensor, name, value)
        self._original_to = original_to


class _Move(torch.autograd.Function):
    """A copy to another (pretend) device; its backward sends the gradient back, as CUDA's does."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, fake: FakeCuda, target: torch.device, dtype: torch.dtype | None,
                memory_format: torch.memory_format) -> torch.Tensor:
        ctx.fake, ctx.source, ctx.dtype = fake, fake.device_of(tensor), tensor.dtype
        if ctx.source.type == "cuda" and target.type == "cpu":
            fake._drain(ctx.source.index)  # a copy to pageable host memory waits for the GPU's queue, as CUDA's does
        out = fake._original_to(tensor, dtype=dtype or tensor.dtype, copy=True, memory_format=memory_format)
        fake.place(out, target)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _Move.apply(grad, ctx.fake, ctx.source, ctx.dtype, torch.preserve_format), None, None, None, None


class _Stream:
    """A CUDA stream on paper: it only knows its GPU (work runs at once, or is queued per GPU)."""

    def __init__(self, fake: FakeCuda, index: int, default: bool = False) -> None:
        self.fake, self.index, self.default = fake, index, default
        self.device = torch.device("cuda", index)

    def wait_event(self, event: _Event) -> None:
        pass  # the queue is one per GPU: its order already holds

    def wait_stream(self, stream: _Stream) -> None:
        pass

    def record_event(self, event: _Event | None = None) -> _Event:
        event = event or _Event(self.fake)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.fake._drain(self.index)

    def query(self) -> bool:
        return self.fake._busy_until[self.index] <= time.perf_counter()

    def __repr__(self) -> str:
        return f"<fake {'default ' if self.default else ''}stream on cuda:{self.index}>"


class _Event:
    """A CUDA event on paper: it completes when the work queued on its GPU before it is done."""

    def __init__(self, fake: FakeCuda) -> None:
        self.fake, self.index, self.at = fake, None, None

    def record(self, stream: _Stream | None = None) -> None:
        stream = stream or self.fake.current_stream()
        self.index = stream.index
        self.at = max(time.perf_counter(), self.fake._busy_until[stream.index])

    def synchronize(self) -> None:
        if self.at is not None:
            self.fake.syncs.append(self.index)
            wait = self.at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)

    def query(self) -> bool:
        return self.at is None or self.at <= time.perf_counter()

    def wait(self, stream: _Stream | None = None) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("CUDA error: both events must be recorded before elapsed_time")
        if self.index != end.index:
            raise RuntimeError("CUDA error: elapsed_time between events of two GPUs (invalid resource handle)")
        return (end.at - self.at) * 1e3  # milliseconds, as CUDA gives them


class _Checks(TorchDispatchMode):
    """Checks each operation's devices as CUDA would and records where its results live."""

    def __init__(self, fake: FakeCuda) -> None:
        super().__init__()
        self.fake = fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        fake = self.fake
        target = kwargs.get("device")
        if target is not None:
            target = fake.cuda(target) if torch.device(target).type == "cuda" else torch.device(target)
            kwargs["device"] = CPU
            if target.type == "cpu" and any(isinstance(t, torch.Tensor) for t in tree_flatten(args)[0]):
                # C++ fills device= in from the input's real device (Tensor.to, *_like): it says nothing.
                # Python code that moves a tensor to the CPU goes through Tensor.to / .cpu, patched below.
                target = None
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # a CPU build cannot pin; the values are the same
        if func.overloadpacket.__name__.startswith("_foreach_"):
            self._check_foreach(func, args)
        elif func in _INDEXING:
            self._check(func, [a for a in (args[0], *args[2:]) if isinstance(a, torch.Tensor)])
        elif func not in _COPIES:
            self._check(func, [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)])
        out = func(*args, **kwargs)
        if target is None:
            if func is aten.copy_.default:
                return out  # the destination stays where it is
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            devices = [fake.device_of(t) for t in inputs]
            target = next((d for d in devices if d.type != "cpu"), CPU)
            if func.overloadpacket.__name__.startswith("_foreach_"):
                if isinstance(out, (list, tuple)):  # one result per position, on that position's device
                    for t, like in zip(out, args[0]):
                        fake.place(t, fake.device_of(like))
                return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                fake.place(t, target)
        return out

    def _check(self, func, tensors: list[torch.Tensor]) -> None:
        seen: dict[torch.device, None] = {}
        for t in tensors:
            device = self.fake.device_of(t)
            if device.type == "cpu" and t.dim() == 0:
                continue  # a CPU scalar may join any device
            seen[device] = None
        if len(seen) > 1:
            a, b = list(seen)[:2]
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{a} and {b}! (FakeCuda, in {func})")

    def _check_foreach(self, func, args) -> None:
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        for column in zip(*lists):
            self._check(func, list(column))


class _QueueBackward(torch.autograd.Function):
    """Identity whose backward queues ``seconds`` of work on the GPU of its input."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fake: FakeCuda, seconds: float) -> torch.Tensor:
        ctx.fake, ctx.seconds, ctx.index = fake, seconds, x.device.index
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.fake.launch(ctx.seconds, ctx.index)
        return grad, None, None


class Queued(torch.nn.Module):
    """A linear layer whose forward and backward each queue a known amount of GPU work
    (:meth:`FakeCuda.launch`): a clock that does not wait for the GPU sees neither."""

    def __init__(self, fake: FakeCuda, forward_s: float, backward_s: float, features: int = 4) -> None:
        super().__init__()
        self.fake, self.forward_s, self.backward_s = fake, forward_s, backward_s
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fake.launch(self.forward_s, x.device.index)
        return _QueueBackward.apply(self.linear(x), self.fake, self.backward_s)
