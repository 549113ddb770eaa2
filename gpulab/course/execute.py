"""nbgrader's ``Execute`` step, made safe for untrusted notebooks: a jailed kernel, and a score
even when the kernel dies or ignores the cell time limit.

nbgrader's own ``Execute`` gives up on the whole submission when the kernel dies (``os._exit``,
a signal, a native crash): nothing is saved and the grades stay empty. It also sends each cell
after an un-interruptible loop to a kernel that is still busy, so every remaining cell waits for
the full cell timeout. :class:`SandboxedExecute` keeps nbgrader's behaviour for everything else
and, in those two cases, stops the kernel and marks every remaining code cell with an error
output (``NotRunError``), so nbgrader scores the tests that ran and gives zero to the rest.
(An un-run test cell with no output would otherwise get *full* marks from nbgrader.)

The sandbox's ``nbgrader_config.py`` switches it on (see :mod:`gpulab.course.sandbox`)::

    c.Autograde.autograde_preprocessors = swap_execute(...)
    c.JailedKernelManager.jail_args = ["--memory-mb", "4096", "--write", "<folder>", ...]
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import psutil
from jupyter_client import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Integer, List, Unicode

# enames written into the notebook; gpulab.course.sandbox turns them into notes.
KERNEL_DIED = "DeadKernelError"
NOT_RUN = "NotRunError"
TIMEOUT = "CellTimeoutError"


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An nbformat error output, which nbgrader scores as a failed cell."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class JailedKernelManager(AsyncKernelManager):
    """Starts the kernel through ``python -m gpulab.course.jail`` (limits, Landlock, audit hook).

    The jail runs the kernel in its own process (no extra process in between), so jupyter_client's
    interrupts and kills reach the kernel itself.
    """

    jail_args = List(Unicode(), help="arguments for python -m gpulab.course.jail").tag(config=True)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if not self.jail_args:
            return cmd
        if len(cmd) >= 3 and cmd[1] == "-m":  # a Python kernel: the jail imports and runs the module
            return [cmd[0], "-m", "gpulab.course.jail", *self.jail_args, "--", *cmd[1:]]
        return [sys.executable, "-m", "gpulab.course.jail", *self.jail_args, "--", *cmd]


class SandboxedExecute(Execute):
    """nbgrader's ``Execute`` that survives a dead or unresponsive kernel (see the module doc)."""

    interrupt_grace = Integer(
        10, help="seconds a kernel has to stop after a cell hits the timeout, before it is killed").tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", JailedKernelManager)
        super().__init__(*args, **kwargs)
        self._stopped: str | None = None

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> tuple[NotebookNode, Any]:
        self._stopped = None
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        if self._stopped is not None:
            if cell.cell_type == "code" and cell.source.strip():
                cell.outputs = [error_output(NOT_RUN, f"not run: {self._stopped}")]
                cell.execution_count = None
            return cell, resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            cell.outputs.append(error_output(
                KERNEL_DIED, "the kernel died while running this cell (os._exit, a signal, or a crash "
                             "in native code); the cells after it were not run"))
            self._stopped = f"the kernel died in cell {index}"
            return cell, resources
        except CellTimeoutError:
            # nbclient interrupted the kernel at the time limit, but the cell did not finish within
            # iopub_timeout (the code caught KeyboardInterrupt, or is stuck in native code).
            cell.outputs.append(error_output(TIMEOUT, f"the cell ran past the {self.timeout} s limit"))
        timed_out = any(o.get("output_type") == "error" and o.get("ename") == TIMEOUT for o in cell.get("outputs", []))
        if timed_out and not self._kernel_responds():
            self._kill_kernel()
            cell.outputs.append(error_output(
                TIMEOUT, f"the kernel kept running after the {self.timeout} s cell limit and an interrupt; it was stopped"))
            self._stopped = f"cell {index} kept the kernel busy past the {self.timeout} s cell limit"
        return cell, resources

    def _kernel_responds(self) -> bool:
        """Whether the kernel answers a kernel_info request within ``interrupt_grace`` seconds
        (it cannot while it is still running the interrupted cell)."""
        saved = self.timeout
        self.timeout = self.interrupt_grace
        try:
            return self.wait_for_reply(self.kc.kernel_info()) is not None
        except DeadKernelError:
            return False
        finally:
            self.timeout = saved

    def _kill_kernel(self) -> None:
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if pid is None:
            return
        try:
            root = psutil.Process(pid)
            for proc in root.children(recursive=True) + [root]:
                proc.kill()
        except psutil.NoSuchProcess:
            pass


def swap_execute(preprocessors: Sequence[type] | None = None) -> list[type]:
    """nbgrader's autograde preprocessor list (or ``preprocessors``) with ``Execute`` replaced
    by :class:`SandboxedExecute`."""
    if preprocessors is None:
        from nbgrader.converters.autograde import Autograde

        preprocessors = Autograde.class_traits()["autograde_preprocessors"].default()
    swapped = [SandboxedExecute if p is Execute else p for p in preprocessors]
    if SandboxedExecute not in swapped:
        raise ValueError("c.Autograde.autograde_preprocessors has no nbgrader Execute step to sandbox; "
                         "keep nbgrader.preprocessors.Execute in the list")
    return swapped
