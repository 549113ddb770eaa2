"""Lab 04 as a multi-GPU server runs it, checked on this CPU: no op mixes two devices' tensors.

On GPUs torch refuses an op whose tensors live on two devices: ``cuda:1 * cuda:0`` raises, and so
does adding two 0-dim losses from two GPUs. On a CPU the four logical devices share one device,
so a cell that adds the losses of two replicas runs here and crashes on the server (issue 39:
graded cell ``gather_concatenates_on_the_output_device`` and the replicate demo).

:class:`OneDevicePerOp` applies CUDA's rule to gpulab's logical devices. Inside a
:class:`~gpulab.devices.MemoryMeter` every new storage is placed on a logical device (from the op's
inputs, or the destination of a ``comm`` transfer), and the mode raises on any op other than a
copy whose tensor arguments span two of them. The lab's source notebook then runs cell by cell
under it, with its real values and its real checks, hidden tests included.

Why not ``FakeTensorMode`` with fake ``cuda:0`` / ``cuda:1`` tensors: on a CPU build of torch
2.13, autograd aborts the whole process (``PyTorch is not linked with support for cuda devices``)
as soon as a fake CUDA tensor that requires grad enters an op, and ``Module.to`` fails under that
mode (``Couldn't swap Linear.weight``); every cell here trains or moves a model.
"""

from __future__ import annotations

import random
from pathlib import Path

import matplotlib
import nbformat
import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.devices import MemoryMeter, logical_devices, placement
from gpulab.grading import lab04
from gpulab.parallel import comm

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "source" / "04_dataparallel" / "04_dataparallel.ipynb"

# the ops that may read one device and write another, as CUDA's peer copies do
_COPIES = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


class MixedDevices(RuntimeError):
    """An op whose tensors live on two logical devices: on GPUs, torch raises there."""


class OneDevicePerOp(TorchDispatchMode):
    """Raise :class:`MixedDevices` on any op, copies aside, whose tensors span two logical devices.

    Enter it inside a ``MemoryMeter``: the meter places every new storage, and this mode reads
    where each argument lives with ``gpulab.devices.placement``. It watches the thread that
    entered it (replica threads compute on one device each; their results come back here).
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _COPIES:
            tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            where = sorted({str(placement(t)) for t in tensors})
            if len(where) > 1:
                shapes = [tuple(t.shape) for t in tensors]
                raise MixedDevices(f"{func} on tensors of shapes {shapes} living on {where}: on GPUs this raises "
                                   "'Expected all tensors to be on the same device'")
        return func(*args, **kwargs)


def _code_cells() -> list[tuple[str, str, str]]:
    """(cell id, grade_id or '', source) of every code cell of the source notebook, in order."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return [(c.id, c.metadata.get("nbgrader", {}).get("grade_id", ""), c.source)
            for c in nb.cells if c.cell_type == "code"]


def test_the_check_catches_what_gpus_refuse():
    """The instrument itself: two replicas' losses do not add, copies do, one device is fine."""
    devices = logical_devices(2, physical=["cpu"])
    x = torch.randn(4, 3)
    with MemoryMeter(), OneDevicePerOp():
        a, b = comm.scatter(x, devices)
        with pytest.raises(MixedDevices, match="logical:0.*logical:1"):
            a.sum() + b.sum()  # 0-dim tensors on two GPUs: torch raises too
        with pytest.raises(MixedDevices):
            torch.cat([a, b])
        total = a.sum() + comm.to(b.sum(), devices[0])  # a copy crosses, then one device adds
        both = comm.gather([a, b], devices[1])
    assert placement(total) == devices[0] and placement(both) == devices[1]
    torch.testing.assert_close(total, x.sum())


def test_every_cell_of_lab04_keeps_each_op_on_one_device():
    """The source notebook, cell by cell (solutions, demos, visible and hidden tests), as four
    GPUs would run it: its checks pass and no op mixes two devices' tensors."""
    namespace: dict = {"__name__": "__main__"}
    mixed = []  # a cell stopped by MixedDevices is listed, and the next cells still run
    try:
        for cell_id, grade_id, source in _code_cells():
            code = compile(source, f"<lab 04 cell {cell_id} {grade_id}>", "exec")
            with MemoryMeter(), OneDevicePerOp():
                try:
                    exec(code, namespace)
                except MixedDevices as err:
                    mixed.append(f"cell {cell_id} ({grade_id or 'not graded'}): {err}")
    finally:
        plt.close("all")
    assert not mixed, "cells that crash on a multi-GPU server:\n" + "\n".join(mixed)


@pytest.mark.parametrize("grader", ["scatter_facts", "gather_facts"])
def test_hidden_graders_keep_each_op_on_one_device(grader):
    """The hidden tests' graders, on gpulab's references, over random cases."""
    devices = logical_devices(4, physical=["cpu"])
    rng = random.Random(7)
    with MemoryMeter(), OneDevicePerOp():
        if grader == "scatter_facts":
            facts = lab04.scatter_facts(comm.scatter, devices, lab04.scatter_cases(rng, 12), 3)
        else:
            facts = lab04.gather_facts(comm.gather, devices, lab04.gather_cases(rng, 12), 3)
    assert len(facts) == 12
