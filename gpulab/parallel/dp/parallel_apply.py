"""Run replica ``i`` on input ``i`` on device ``i``, all at once, one thread per replica.

The middle of DataParallel (``torch/nn/parallel/parallel_apply.py``). Threads are enough: the
heavy work runs in torch kernels, which release the GIL, and on GPUs each thread only queues
kernels on its own device. Three details make threads behave like the caller:

- **Thread-local state is carried in.** Grad mode, inference mode and autocast are per thread,
  and a new thread starts with the defaults (grad on, autocast off). Without carrying them, a
  ``torch.no_grad()`` evaluation would build graphs in the replicas, and ``torch.autocast`` would
  silently run the replicas in float32.
- **Each thread enters its device** (``with devices[i]:``; on a GPU that also sets the current
  CUDA device), so whatever a replica allocates without inputs lands on its own device.
- **An exception in a replica is re-raised in the caller**, with the replica's index and device
  in the message and the original chained, after every thread has finished (none is left running).

A :class:`~gpulab.devices.MemoryMeter` active in the caller follows these threads by itself.

Example::

    outputs = parallel_apply(replicas, [(x0,), (x1,)], devices[:2])
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch

from gpulab.devices.logical import LogicalDevice
from gpulab.devices.validate import check_devices

__all__ = ["parallel_apply", "ReplicaError"]

_AUTOCAST_TYPES = ("cpu", "cuda")


class ReplicaError(RuntimeError):
    """Raised for an exception in a replica whose type cannot carry a new message."""


def _thread_state() -> dict[str, Any]:
    """The caller's per-thread autograd and autocast settings."""
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "autocast": {t: (torch.is_autocast_enabled(t), torch.get_autocast_dtype(t)) for t in _AUTOCAST_TYPES},
    }


def _run(fn: Callable, args: Any, kwargs: dict, device: LogicalDevice, state: dict[str, Any]) -> Any:
    """Call ``fn`` on ``device`` under the caller's thread state."""
    if not isinstance(args, (list, tuple)):
        args = (args,)  # one tensor is one argument (never iterate over its rows)
    enabled, dtype = state["autocast"].get(device.physical.type, (False, None))
    with torch.inference_mode(state["inference"]), torch.set_grad_enabled(state["grad"]), device:
        if enabled:
            with torch.autocast(device.physical.type, dtype=dtype):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)


def _reraise(exc: BaseException, index: int, device: LogicalDevice) -> BaseException:
    """The exception to raise in the caller: same type, message naming the replica."""
    msg = f"in replica {index} on {device!r}: {type(exc).__name__}: {exc}"
    try:
        new = type(exc)(msg)
    except Exception:  # exception types with other constructors
        new = ReplicaError(msg)
    if str(new) != msg and not isinstance(new, KeyError):  # a type that rewrites its message
        new = ReplicaError(msg)
    return new


def parallel_apply(modules: Sequence[Callable], inputs: Sequence[Any], devices: Sequence[LogicalDevice],
                   kwargs: Sequence[dict] | None = None) -> list[Any]:
    """Call ``modules[i](*inputs[i], **kwargs[i])`` on ``devices[i]``, in parallel threads.

    Args:
        modules: the replicas (or any callables, e.g. a loss function per device).
        inputs: one entry per replica: a tuple of positional arguments, or a single argument.
        devices: one logical device per replica.
        kwargs: one dict of keyword arguments per replica (default: none).

    Returns:
        The outputs, in replica order.

    Raises:
        ValueError: if the lists have different lengths (or are empty).
        Exception: the first failing replica's exception, of the same type where it can be
            rebuilt (else :class:`ReplicaError`), saying ``in replica i on logical:i``; the
            original is chained as ``__cause__``.
    """
    devices = check_devices(devices)
    kwargs = [{} for _ in modules] if kwargs is None else list(kwargs)
    if not len(modules) == len(inputs) == len(devices) == len(kwargs):
        raise ValueError(f"parallel_apply needs one input, device and kwargs dict per module: got "
                         f"{len(modules)} modules, {len(inputs)} inputs, {len(devices)} devices, {len(kwargs)} kwargs")
    if not modules:
        raise ValueError("parallel_apply got no modules")
    state = _thread_state()
    results: list[Any] = [None] * len(modules)
    errors: list[BaseException | None] = [None] * len(modules)

    def worker(i: int) -> None:
        try:
            results[i] = _run(modules[i], inputs[i], kwargs[i], devices[i], state)
        except Exception as exc:  # re-raised in the caller below
            errors[i] = exc

    if len(modules) == 1:
        worker(0)  # nothing to overlap: no thread
    else:
        threads = [threading.Thread(target=worker, args=(i,), name=f"gpulab-replica-{i}")
                   for i in range(len(modules))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i, exc in enumerate(errors):
        if exc is not None:
            raise _reraise(exc, i, devices[i]) from exc
    return results
