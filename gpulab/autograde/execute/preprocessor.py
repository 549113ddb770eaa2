"""nbgrader's ``Execute`` step, the one subclass the kit has, in three modes:

- ``validate`` (Validate, ``make check``): nbgrader's own execution, except that after a cell stopped
  by the time limit each failing test cell names it;
- ``graded`` (a student's notebook in the grading sandbox): the jailed kernel
  (:mod:`gpulab.autograde.execute.kernel`) runs the cells and sends evidence; this process, which
  the kernel cannot reach, writes each test cell's verdict;
- ``reference`` (the lab's source notebook, once per grading run): the evidence is kept as the
  expected side.

Per cell in the graded and reference modes: 1. run it, keeping at most ``max_output_kb`` of output; after a kernel that died or ignored the time
   limit, the remaining cells are marked :data:`~gpulab.autograde.execute.outputs.NOT_RUN` (an un-run
   test cell with no output would otherwise get *full* marks);
2. take the evidence the cell sent (:mod:`gpulab.evidence`) out of its outputs;
3. measure each measured check from this side (:mod:`gpulab.autograde.execute.requests`);
4. in a test cell, keep the evidence (reference) or judge it against the reference run's
   (:func:`gpulab.verdict.cell.judge_cell`), and rewrite the cell's outputs so that nbgrader scores
   the verdict (:func:`~gpulab.autograde.execute.outputs.write_verdict`).
"""

from __future__ import annotations

import json
import os
import resource
from typing import Any

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Integer, Unicode

from gpulab.autograde.box import links
from gpulab.autograde.execute import requests
from gpulab.autograde.execute.kernel import MAX_MESSAGE_BYTES, JailedKernelManager, kill_kernel
from gpulab.autograde.execute.outputs import (
    FULL,
    KERNEL_DIED,
    MAX_EVIDENCE_BYTES,
    MAX_RECORDS,
    NOT_RUN,
    OUTPUT_CAPPED,
    TIMEOUT,
    OutputCap,
    after_timeout,
    error_output,
    is_test,
    is_timeout,
    make_room,
    size,
    write_verdict,
)
from gpulab.autograde.expected import Expected
from gpulab.confine.isolation import kill_marked
from gpulab.evidence.records import Measured, parse
from gpulab.evidence.wire import MIME
from gpulab.verdict.cell import MeasuredRuns, judge_cell

VALIDATE, GRADED, REFERENCE = "validate", "graded", "reference"


class GpulabExecute(Execute):
    """nbgrader's ``Execute`` that names a cell stopped by the time limit, survives a dead or
    unresponsive kernel, and (graded, reference) decides each test cell from evidence."""

    mode = Unicode(VALIDATE, help="'validate': nbgrader's execution; 'graded': judge each test cell against "
                                  "`expected`; 'reference': record the evidence (into `reference_out`)").tag(config=True)
    expected = Unicode("", help="the reference run of this lab (gpulab.autograde.reference.Expected)").tag(config=True)
    reference_out = Unicode("", help="reference mode: where to write the expected values").tag(config=True)
    timing_secret = Unicode("", help="the grading run's secret, for the measured runs' seeds").tag(config=True)
    measure_lock = Unicode("", help="the file every grading job of this machine locks while it measures a kernel's "
                                    "runs").tag(config=True)
    kernel_cgroup = Unicode("", help="the kernel's cgroup folder (its cpu.stat), for measured runs").tag(config=True)
    interrupt_grace = Integer(
        10, help="seconds a kernel has to stop after a cell hits the timeout, before it is killed").tag(config=True)
    clean_dir = Unicode("", help="the kernel's folder: links, FIFOs, devices and hard links are removed from it "
                                 "once the kernel is gone, before nbgrader writes there").tag(config=True)
    clean_log = Unicode("", help="a file where what was removed from clean_dir is listed, one per line").tag(config=True)
    max_output_kb = Integer(1024, help="output kept per cell (text, images, widget state), KiB; past it, "
                                       "outputs are dropped and the cell says so").tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.mode == GRADED and not issubclass(self.kernel_manager_class, JailedKernelManager):
            self.kernel_manager_class = JailedKernelManager  # a student's kernel is never started otherwise
        self._stopped: str | None = None
        self._timed_out: int | None = None
        self._reply: dict[str, Any] | None = None
        self._cap = OutputCap(self.max_output_kb * 1024)
        self._records: dict[int, list[Any]] = {}
        self._evidence_bytes: dict[int, int] = {}
        self._overflow: set[int] = set()
        self._expected: Expected | None = None
        self._recorded: dict[str, dict[str, Any]] = {}  # reference mode: grade_id -> cell
        self._notebook = ""
        self._lang: str | None = None

    @property
    def _judging(self) -> bool:
        return self.mode in (GRADED, REFERENCE)

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> tuple[NotebookNode, Any]:
        self._stopped, self._timed_out = None, None
        if not self._judging:
            return super().preprocess(nb, resources, km)
        self._cap = OutputCap(self.max_output_kb * 1024)
        initial = set(os.listdir(self.clean_dir)) if self.clean_dir and os.path.isdir(self.clean_dir) else set()
        self._notebook = ((resources or {}).get("unique_key") or "").rsplit("/", 1)[-1] or \
            (resources or {}).get("metadata", {}).get("name", "")
        if self.mode == GRADED and self.expected:
            self._expected = Expected.load(self.expected)
        lang = nb.metadata.get("gpulab", {}).get("lang") if self.mode == GRADED else None
        self._lang = lang if isinstance(lang, str) else None  # the edition the student worked in (gpulab.i18n)
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._after_kernel(initial)

    def _after_kernel(self, initial: set[str]) -> None:
        """The kernel is gone: stop whatever it left running, then make sure nothing nbgrader writes next
        (the notebook, set_permissions) can follow a link the kernel planted."""
        marker = os.environ.get("GPULAB_SANDBOX")
        if marker:
            kill_marked(marker)
        if self.clean_dir:
            removed = links.remove_unsafe(self.clean_dir)
            freed = make_room(self.clean_dir, initial)
            removed += [f"{FULL} {len(freed)} entries it created ({', '.join(freed[:3])})"] if freed else []
            if removed and self.clean_log:
                with open(self.clean_log, "a") as log:
                    log.writelines(f"{entry}\n" for entry in removed)
        if self.mode == REFERENCE and self.reference_out:
            _save(self.reference_out, self._notebook, self._recorded)
        self.log.info("gpulab: nbgrader peak memory %s MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)

    # ---- output: evidence is taken out; the rest is kept up to a cap per cell ----

    def output(self, outs: list[NotebookNode], msg: dict[str, Any], display_id: str | None,
               cell_index: int) -> NotebookNode | None:
        if not self._judging:
            return super().output(outs, msg, display_id, cell_index)
        content = msg.get("content", {})
        if msg.get("msg_type") == "display_data" and MIME in (content.get("data") or {}):
            self._take_evidence(cell_index, content["data"][MIME], size(content))
            return None
        n, error = size(content), msg.get("msg_type") == "error"
        if error and n > self._cap.cap:  # an error is always kept, but not all of it
            content["evalue"] = str(content.get("evalue", ""))[:self._cap.cap // 2]
            content["traceback"] = [str(t)[:1024] for t in content.get("traceback", [])[-20:]]
            n = size(content)
        if self._cap.admit(cell_index, n, always=error):
            return super().output(outs, msg, display_id, cell_index)
        self._cap.mark(outs, cell_index)
        return None

    def _take_evidence(self, cell_index: int, record: Any, n: int) -> None:
        records = self._records.setdefault(cell_index, [])
        used = self._evidence_bytes.get(cell_index, 0) + n
        self._evidence_bytes[cell_index] = used
        if len(records) >= MAX_RECORDS or used > MAX_EVIDENCE_BYTES:
            self._overflow.add(cell_index)
            return
        records.append(record)

    def handle_comm_msg(self, outs: list[NotebookNode], msg: dict[str, Any], cell_index: int) -> None:
        if not self._judging or self._cap.admit(cell_index, size(msg.get("content", {}))):
            super().handle_comm_msg(outs, msg, cell_index)  # widget state past the cap is not kept either

    def on_cell_executed(self, **kwargs: Any) -> None:
        super().on_cell_executed(**kwargs)
        self._reply = (kwargs.get("execute_reply") or {}).get("content")

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        if not self._judging:
            return self._validate_cell(cell, resources, index)
        if self._stopped is not None:
            if cell.cell_type == "code" and cell.source.strip():
                cell.outputs = [error_output(NOT_RUN, f"not run: {self._stopped}")]
                cell.execution_count = None
            return cell, resources
        self._reply = None
        self._records.pop(index, None)
        try:
            cell, resources = self._run_cell(cell, resources, index)
        finally:
            self._heal_iopub(cell)
        records = self._records.pop(index, [])
        if is_test(cell):
            self._decide(cell, index, records)
        return cell, resources

    def _validate_cell(self, cell: NotebookNode, resources: Any, index: int) -> tuple[NotebookNode, Any]:
        cell, resources = super().preprocess_cell(cell, resources, index)
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if any(o.get("ename") == TIMEOUT for o in errors):
            self._timed_out = index if self._timed_out is None else self._timed_out
        elif errors and self._timed_out is not None and cell.metadata.get("nbgrader", {}).get("grade"):
            note = after_timeout(self._timed_out, self.timeout)
            for out in errors:
                out["evalue"] = f"{out.get('evalue', '')} {note}"
                out["traceback"] = list(out.get("traceback", [])) + [note]
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
        timed_out = is_timeout(cell)
        if timed_out and self._timed_out is None:
            self._timed_out = index
        if timed_out and not self._kernel_responds():
            kill_kernel(self.km)
            cell.outputs.append(error_output(
                TIMEOUT, f"the kernel kept running after the {self.timeout} s cell limit and an interrupt; it was stopped"))
            self._stopped = f"cell {index} kept the kernel busy past the {self.timeout} s cell limit"
        return cell, resources

    # ---- the verdict of a test cell: evidence judged here, never the kernel's own say ----

    def _kernel_error(self, cell: NotebookNode) -> str:
        reply = self._reply or {}
        if reply.get("status") == "error":
            return f"{str(reply.get('ename', 'Error'))[:100]}: {str(reply.get('evalue', ''))[:1000]}"
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:  # a timeout or a dead kernel, written by this process
            return f"{errors[-1].get('ename')}: {str(errors[-1].get('evalue', ''))[:1000]}"
        return ""

    def _decide(self, cell: NotebookNode, index: int, records: list[Any]) -> None:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell-{index}")
        error = self._kernel_error(cell)
        if index in self._overflow:
            records, error = [], f"the cell sent more than {MAX_RECORDS} values or {MAX_EVIDENCE_BYTES >> 20} MiB"
        if self.mode == REFERENCE:
            reference = {"entries": [requests.reference_entry(self, self._notebook, gid, k, rec) for k, rec in enumerate(records)],
                         "error": error}
            self._recorded[gid] = reference
            records = [{"kind": "measured", "id": 0} if e.get("kind") == "measured" else
                       {"kind": "check", "value": e.get("value")} for e in reference["entries"]]
            runs = {n: MeasuredRuns.from_json(e["runs"]) for n, e in enumerate(reference["entries"])
                    if e.get("kind") == "measured"}
            result = judge_cell(reference, records, runs, error)
        else:
            reference = self._expected.cell(self._notebook, gid) if self._expected else None
            if reference is None:
                write_verdict(cell, False, f"the grader has no reference for the test cell {gid!r}", [])
                return
            runs = {}
            for n, (rec, entry) in enumerate(zip(records, reference["entries"])):
                got = parse(rec)
                if isinstance(got, Measured) and entry.get("kind") == "measured" and self._stopped is None:
                    spec = entry.get("spec", {})
                    runs[n] = requests.measure(self, got.id, entry["seeds"], int(spec.get("warmup", 1)))
            result = judge_cell(reference, records, runs, error, self._lang)
        message = result.message
        if not result.passed and self._timed_out is not None and not is_timeout(cell):  # the cause, as Validate says
            message = f"{message or 'failed'} {after_timeout(self._timed_out, self.timeout)}"
        write_verdict(cell, result.passed, message, result.figures, result.note)

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


def _save(path: str, notebook: str, cells: dict[str, Any]) -> None:
    data = json.loads(open(path).read()) if os.path.exists(path) else {}
    data[notebook] = cells
    with open(path, "w") as fh:
        json.dump(data, fh)
