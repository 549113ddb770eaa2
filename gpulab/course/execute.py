"""nbgrader's ``Execute`` step, made safe for untrusted notebooks: a jailed kernel, and a score
even when the kernel dies or ignores the cell time limit.

nbgrader's own ``Execute`` gives up on the whole submission when the kernel dies (``os._exit``,
a signal, a native crash): nothing is saved and the grades stay empty. It also sends each cell
after an un-interruptible loop to a kernel that is still busy, so every remaining cell waits for
the full cell timeout. :class:`SandboxedExecute` keeps nbgrader's behaviour for everything else
and, in those two cases, stops the kernel and marks every remaining code cell with an error
output (``NotRunError``), so nbgrader scores the tests that ran and gives zero to the rest.
(An un-run test cell with no output would otherwise get *full* marks from nbgrader.)

It also keeps at most ``max_output_kb`` of output per cell (errors are always kept, shortened):
the rest is dropped and the cell says so (:data:`OUTPUT_CAPPED`), so an output flood cannot grow
nbgrader's memory or the notebook. A single message too big to read
(:data:`gpulab.course.kernel.MAX_MESSAGE_BYTES`) is refused before nbgrader reads it, and the
IOPub connection is reopened (:meth:`gpulab.course.kernel.CappedKernelClient.reopen_iopub`).

The sandbox's ``nbgrader_config.py`` switches it on (see :mod:`gpulab.course.sandbox`)::

    c.Autograde.autograde_preprocessors = swap_execute(...)
    c.JailedKernelManager.jail_args = ["--memory-mb", "4096", "--write", "<folder>", ...]
"""

from __future__ import annotations

import os
import time
from queue import Empty
from typing import Any, Sequence

import psutil
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Integer, Unicode

from gpulab.course import links, scan, tamper
from gpulab.course.kernel import MAX_MESSAGE_BYTES, JailedKernelManager
from gpulab.course.processes import kill_marked

# enames written into the notebook; gpulab.course.sandbox turns them into notes.
KERNEL_DIED = "DeadKernelError"
NOT_RUN = "NotRunError"
TIMEOUT = "CellTimeoutError"
TAMPERED = tamper.TAMPERED
FLAGGED = "FlaggedCodeError"
# Written into a cell whose output passed the cap; gpulab.course.notes turns it into a note.
OUTPUT_CAPPED = "[gpulab grader: output past the cap was dropped:"


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An nbformat error output, which nbgrader scores as a failed cell."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class SandboxedExecute(Execute):
    """nbgrader's ``Execute`` that survives a dead or unresponsive kernel (see the module doc)."""

    interrupt_grace = Integer(
        10, help="seconds a kernel has to stop after a cell hits the timeout, before it is killed").tag(config=True)
    probes = Bool(True, help="snapshot the tests' tools, then verify them and run a canary after each test cell "
                             "(gpulab.course.tamper)").tag(config=True)
    flagged = Unicode("note", help="'note': code only tampering needs is noted; 'zero': the test cells after "
                                   "it also score 0 (gpulab.course.scan)").tag(config=True)
    clean_dir = Unicode("", help="the kernel's folder: links, FIFOs, devices and hard links are removed from it "
                                 "once the kernel is gone, before nbgrader writes there").tag(config=True)
    clean_log = Unicode("", help="a file where what was removed from clean_dir is listed, one per line").tag(config=True)
    max_output_kb = Integer(1024, help="output kept per cell (text, images, widget state), KiB; past it, "
                                       "outputs are dropped and the cell says so").tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", JailedKernelManager)
        super().__init__(*args, **kwargs)
        self._stopped: str | None = None
        self._snapshot: dict[str, Any] | None = None
        self._reply: dict[str, Any] | None = None
        self._zero_after: int | None = None
        self._kept: dict[int, int] = {}     # cell index -> output bytes kept
        self._dropped: dict[int, int] = {}  # cell index -> output bytes dropped

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> tuple[NotebookNode, Any]:
        self._stopped, self._snapshot, self._zero_after = None, None, None
        if self.flagged == "zero":
            found = [i for i, cell in enumerate(nb.cells) if scan.scan_cell(cell)]
            self._zero_after = found[0] if found else None
        try:
            return super().preprocess(nb, resources, km)
        finally:
            # The kernel is gone: stop whatever it left running, then make sure nothing nbgrader writes
            # next (the notebook, set_permissions) can follow a link the kernel planted.
            marker = os.environ.get("GPULAB_SANDBOX")
            if marker:
                kill_marked(marker)
            if self.clean_dir:
                removed = links.remove_unsafe(self.clean_dir)
                if removed and self.clean_log:
                    with open(self.clean_log, "a") as log:
                        log.writelines(f"{entry}\n" for entry in removed)
            self.log.info("gpulab: nbgrader peak memory %s MiB", _peak_rss_mb())

    # ---- output: what the kernel sends is kept up to a cap per cell ----

    def output(self, outs: list[NotebookNode], msg: dict[str, Any], display_id: str | None,
               cell_index: int) -> NotebookNode | None:
        size = _size(msg.get("content", {}))
        cap = self.max_output_kb * 1024
        if msg.get("msg_type") == "error" and size > cap:  # an error is always kept (it scores), but not all of it
            content = msg["content"]
            content["evalue"] = str(content.get("evalue", ""))[:cap // 2]
            content["traceback"] = [str(t)[:1024] for t in content.get("traceback", [])[-20:]]
            size = _size(content)
        if msg.get("msg_type") == "error" or self._kept.get(cell_index, 0) + size <= cap:
            self._kept[cell_index] = self._kept.get(cell_index, 0) + size
            return super().output(outs, msg, display_id, cell_index)
        if cell_index not in self._dropped:
            outs.append(NotebookNode(output_type="stream", name="stderr", text=""))
        self._dropped[cell_index] = self._dropped.get(cell_index, 0) + size
        marker = next(o for o in reversed(outs) if o.get("output_type") == "stream" and o.get("name") == "stderr"
                      and (o.get("text") == "" or o.get("text", "").startswith(OUTPUT_CAPPED)))
        marker["text"] = f"{OUTPUT_CAPPED} {self._dropped[cell_index] / 2**20:.1f} MiB past {self.max_output_kb} KiB]\n"
        return None

    def handle_comm_msg(self, outs: list[NotebookNode], msg: dict[str, Any], cell_index: int) -> None:
        size = _size(msg.get("content", {}))
        if self._kept.get(cell_index, 0) + size > self.max_output_kb * 1024:
            self._dropped[cell_index] = self._dropped.get(cell_index, 0) + size
            return  # widget state past the cap is not kept either
        self._kept[cell_index] = self._kept.get(cell_index, 0) + size
        super().handle_comm_msg(outs, msg, cell_index)

    def on_cell_executed(self, **kwargs: Any) -> None:
        super().on_cell_executed(**kwargs)
        self._reply = (kwargs.get("execute_reply") or {}).get("content")

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        if self._stopped is not None:
            if cell.cell_type == "code" and cell.source.strip():
                cell.outputs = [error_output(NOT_RUN, f"not run: {self._stopped}")]
                cell.execution_count = None
            return cell, resources
        if self.probes and self._snapshot is None and cell.cell_type == "code" and cell.source.strip():
            lab = (resources or {}).get("nbgrader", {}).get("assignment")
            self._snapshot = self._fingerprint(tamper.grader_modules(lab)) or {}
        self._reply = None
        try:
            cell, resources = self._run_cell(cell, resources, index)
        finally:
            self._heal_iopub(cell)
            if _is_test(cell):
                self._judge(cell, index)
        return cell, resources

    def _heal_iopub(self, cell: NotebookNode) -> None:
        """If the cell sent a message too big to read, say so in the cell and reconnect IOPub."""
        lost = getattr(self.kc, "iopub_lost", None)
        if self._stopped is not None or lost is None or not lost():
            return
        cell.outputs.append(NotebookNode(output_type="stream", name="stderr", text=f"{OUTPUT_CAPPED} a message over "
                                                                                    f"{MAX_MESSAGE_BYTES >> 20} MiB]\n"))
        try:
            run_sync(self.kc.reopen_iopub)(timeout=max(30, self.timeout or 0))
        except RuntimeError:
            self._stopped = "the kernel's output could not be read again after an oversized message"

    def _run_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
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

    # ---- the score of a test cell comes from the kernel's reply and the probes, not its display ----

    def _judge(self, cell: NotebookNode, index: int) -> None:
        """Make a test cell's outputs say what really happened (nbgrader scores it from its outputs)."""
        outputs = list(cell.get("outputs", []))
        for out in outputs:  # a value shown by a test cell is not a score (nbgrader reads a number as one)
            if out.get("output_type") == "execute_result":
                out["output_type"] = "display_data"
                out.pop("execution_count", None)
        reply = self._reply or {}
        errors = [o for o in outputs if o.get("output_type") == "error"]
        if reply.get("status") == "error" and not any(o is outputs[0] for o in errors):
            # the reply says the cell failed: the error goes first, whatever the kernel displayed before it
            recorded = [o for o in errors if o.get("ename") == reply.get("ename")]
            first = recorded[0] if recorded else error_output(reply.get("ename", "Error"), reply.get("evalue", ""))
            outputs = [first] + [o for o in outputs if o is not first]
        problems: list[str] = []
        if self._stopped is None and self.probes and self._snapshot:
            nonce = tamper.new_nonce()  # one round trip: the fingerprint is printed, then the canary fails
            reply_c, stdout, errs = self._probe(tamper.fingerprint_code() + tamper.canary_code(nonce))
            problems = tamper.compare(self._snapshot, tamper.parse_fingerprint(stdout))
            verdict = tamper.canary_verdict(nonce, reply_c, errs)
            if verdict:
                problems.insert(0, verdict)
        if problems:
            outputs.insert(0, error_output(TAMPERED, "the tests' tools were tampered with: " + "; ".join(problems[:4])))
        if self._zero_after is not None and index > self._zero_after:
            outputs.insert(0, error_output(FLAGGED, f"cell {self._zero_after} holds code only tampering needs; "
                                                    "this course scores the tests after it 0"))
        cell.outputs = outputs

    def _fingerprint(self, preload: tuple[str, ...] = ()) -> dict[str, Any] | None:
        _, stdout, _ = self._probe(tamper.fingerprint_code(preload))
        return tamper.parse_fingerprint(stdout)

    async def _async_probe(self, code: str) -> tuple[dict[str, Any] | None, str, list[dict[str, Any]]]:
        """Run ``code`` in the kernel, outside the notebook; (reply content, stdout, error contents)."""
        msg_id = await ensure_async(self.kc.execute(code, store_history=False, stop_on_error=False))
        deadline = time.monotonic() + max(30, self.timeout or 0)
        reply = None
        while reply is None and time.monotonic() < deadline:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=1))
            except Empty:
                if not await ensure_async(self.kc.is_alive()):
                    raise DeadKernelError("Kernel died") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg["content"]
        stdout, errors = [], []
        while reply is not None and time.monotonic() < deadline:
            try:
                msg = await ensure_async(self.kc.iopub_channel.get_msg(timeout=1))
            except Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content.get("name") == "stdout":
                stdout.append(content.get("text", ""))
            elif kind == "error":
                errors.append(content)
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        return reply, "".join(stdout), errors

    def _probe(self, code: str) -> tuple[dict[str, Any] | None, str, list[dict[str, Any]]]:
        try:
            return run_sync(self._async_probe)(code)
        except DeadKernelError:
            return None, "", []

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


def _size(content: Any) -> int:
    """About how many bytes a message's content holds (its strings), without serialising it."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, dict):
        return sum(_size(v) for v in content.values())
    if isinstance(content, (list, tuple)):
        return sum(_size(v) for v in content)
    return 8


def _peak_rss_mb() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def _is_test(cell: NotebookNode) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


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
