"""DataParallel from its four pieces: scatter, replicate, parallel_apply, gather (lab 04).

One process drives every device. Each step it splits the batch (:func:`~gpulab.parallel.
scatter_gather.scatter_kwargs`), copies the model onto each device (:func:`~gpulab.parallel.
replicate.replicate`), runs the replicas in threads (:func:`~gpulab.parallel.dp.parallel_apply.
parallel_apply`) and concatenates their outputs on one device (:func:`~gpulab.parallel.
scatter_gather.gather`). The backward pass retraces the same path: each output piece's gradient
goes back to its device, and each replica's parameter gradients are summed onto the original, so
the gradients equal a single-device run on the whole batch.

The cost this lab measures is the gather. Every output lands on ``output_device``, and the loss,
its gradient and every temporary of the loss are computed there on the *whole* batch, while the
other devices only ever hold their piece. With a large output (a language-model head over a
30,000-word vocabulary) that device needs several times the memory of the others, which caps the
batch size for all of them. ``output_device=devices[1]`` only moves that load to another device
(lab 04 measures both); computing the loss where the outputs are is the fix
(:mod:`gpulab.parallel.dp.balanced`, lab 05).

This is the design of ``torch.nn.DataParallel``; torch's version needs CUDA. On a CPU-only
machine ``torch.nn.DataParallel`` ignores ``device_ids`` and calls the module once on the whole
batch, silently, which is why gpulab rebuilds it on logical devices.

Example::

    devices = logical_devices(4)
    model = DataParallel(LargeVocabHead(), devices)
    loss = F.cross_entropy(model(x), comm.to(y, devices[0]))
    loss.backward()               # model.module's .grad equals a single-device run's

The same step as a function, ``data_parallel(module, x, devices, output_device)`` (the shape of
``torch.nn.parallel.data_parallel``, and of lab 04's exercise 5), and any such function made a
module again, so that code written for a DataParallel model measures it
(``FunctionalDataParallel(my_data_parallel, head, devices)``: lab 04's memory measurements of the
student's own DataParallel).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices.logical import LogicalDevice
from gpulab.devices.validate import check_device, check_devices
from gpulab.parallel.dp.parallel_apply import parallel_apply
from gpulab.parallel.dp.replicate import check_module_on, replicate
from gpulab.parallel.dp.scatter_gather import gather, scatter_kwargs

__all__ = ["DataParallel", "data_parallel", "FunctionalDataParallel"]


class DataParallel(nn.Module):
    """Split each batch over ``devices``, run a replica of ``module`` on each, gather the outputs.

    Args:
        module: the model; its parameters and buffers live on ``devices[0]`` (a model built on the
            CPU, or on the first GPU, is there).
        devices: the logical devices (:func:`gpulab.devices.logical_devices`).
        output_device: where the outputs are gathered (default ``devices[0]``). It need not be one
            of ``devices``.
        dim: the batch dimension of inputs and outputs.

    Raises:
        TypeError: if ``devices`` holds strings, ints or ``torch.device``\\ s, or ``module`` is not
            a module.
        ValueError: if ``devices`` is empty or lists a device twice, or the module's parameters
            are not on ``devices[0]``.

    Warning:
        In-place updates to buffers in ``forward`` (BatchNorm's running statistics) are kept from
        replica 0 only, and BatchNorm normalises each piece with that piece's own statistics: in
        training mode the outputs equal a single-device run on each piece, not on the whole batch.
        A batch of fewer rows than devices uses only as many devices as it has rows.
    """

    def __init__(self, module: nn.Module, devices: Sequence[LogicalDevice],
                 output_device: LogicalDevice | None = None, dim: int = 0) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__} wraps an nn.Module, got {type(module).__name__}")
        self.devices = check_devices(devices)
        self.output_device = self.devices[0] if output_device is None else check_device(output_device, "output_device")
        self.dim = dim
        self.module = module
        check_module_on(module, self.devices[0])  # fail now, not at the first batch

    # The four steps, as methods so that a subclass can change one (DataParallelModel: no gather).
    def scatter(self, inputs: tuple, kwargs: dict) -> tuple[list[tuple], list[dict]]:
        """Split the call's arguments into one piece per device (fewer for a small batch)."""
        return scatter_kwargs(inputs, kwargs, self.devices, self.dim)

    def replicate(self, module: nn.Module, devices: Sequence[LogicalDevice]) -> list[nn.Module]:
        """One replica per device, parameters broadcast differentiably."""
        return replicate(module, devices)

    def parallel_apply(self, replicas: Sequence[nn.Module], inputs: Sequence[tuple], kwargs: Sequence[dict],
                       devices: Sequence[LogicalDevice]) -> list[Any]:
        """Run each replica on its piece, in threads."""
        return parallel_apply(replicas, inputs, devices, kwargs)

    def gather(self, outputs: list[Any], output_device: LogicalDevice) -> Any:
        """Concatenate the outputs on ``output_device``."""
        return gather(outputs, output_device, self.dim)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        inputs, kwargs = self.scatter(inputs, kwargs)  # (pieces may be fewer than devices)
        devices = self.devices[:len(inputs)]
        replicas = self.replicate(self.module, devices)
        outputs = self.parallel_apply(replicas, inputs, kwargs, devices)
        return self.gather(outputs, self.output_device)

    def extra_repr(self) -> str:
        return f"devices={[str(d) for d in self.devices]}, output_device={self.output_device}, dim={self.dim}"


def data_parallel(module: nn.Module, inputs: torch.Tensor, devices: Sequence[LogicalDevice],
                  output_device: LogicalDevice | None = None) -> Any:
    """``module(inputs)`` computed by :class:`DataParallel` over ``devices``, gathered on
    ``output_device`` (default ``devices[0]``): the functional form, as
    ``torch.nn.parallel.data_parallel``. Raises what :class:`DataParallel` raises."""
    return DataParallel(module, devices, output_device)(inputs)


class FunctionalDataParallel(nn.Module):
    """A DataParallel model whose forward is a data-parallel *function*:
    ``forward(x) = fn(module, x, devices, output_device)``.

    It holds ``module`` (so ``parameters()`` and ``zero_grad()`` reach the original weights),
    ``devices`` and ``output_device`` (resolved: ``devices[0]`` when not given), like
    :class:`DataParallel`, so a measurement written for one (``step_memory``, lab 04's
    ``step_peaks``) measures whatever ``fn`` does: lab 04 wraps the student's ``data_parallel``.
    ``fn`` gets ``output_device`` as given, None included.

    Args:
        fn: ``fn(module, batch, devices, output_device) -> output`` (:func:`data_parallel`, or yours).
        module, devices, output_device: as for :class:`DataParallel`.

    Raises:
        TypeError: if ``fn`` is not callable, or for the arguments :class:`DataParallel` rejects.
        ValueError: as :class:`DataParallel`.
    """

    def __init__(self, fn: Callable[..., Any], module: nn.Module, devices: Sequence[LogicalDevice],
                 output_device: LogicalDevice | None = None) -> None:
        super().__init__()
        if not callable(fn) or isinstance(fn, nn.Module):
            raise TypeError(f"{type(self).__name__} takes a data-parallel function fn(module, batch, devices, "
                            f"output_device) first, got {type(fn).__name__}: to wrap a module, use DataParallel")
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__} wraps an nn.Module, got {type(module).__name__}")
        self.fn = fn
        self.devices = check_devices(devices)
        self.requested_output_device = None if output_device is None else check_device(output_device, "output_device")
        self.output_device = self.devices[0] if output_device is None else self.requested_output_device
        self.module = module
        check_module_on(module, self.devices[0])

    def forward(self, batch: torch.Tensor) -> Any:
        return self.fn(self.module, batch, list(self.devices), self.requested_output_device)

    def extra_repr(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"fn={name}, devices={[str(d) for d in self.devices]}, output_device={self.output_device}"
