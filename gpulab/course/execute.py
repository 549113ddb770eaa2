"""nbgrader's ``Execute`` step for untrusted notebooks: the kernel runs the cells and sends evidence;
this process, which the kernel cannot reach, writes each test cell's verdict.

:class:`SandboxedExecute` replaces ``Execute`` in the grading sandbox (``swap_execute`` in its
``nbgrader_config.py``) and runs the reference kernel (:mod:`gpulab.course.reference`). Per cell:

1. run it in the jailed kernel (:mod:`gpulab.course.kernel`), keeping at most ``max_output_kb`` of
   output; after a kernel that died or ignored the time limit, the remaining cells are marked
   :data:`NOT_RUN` (an un-run test cell with no output would otherwise get *full* marks);
2. take the evidence the cell sent (:mod:`gpulab.grading.evidence`) out of its outputs;
3. measure each measured check from this side (:meth:`SandboxedExecute._measured_runs`): one
   request per run, on a seed revealed only then, one grading job's measured runs at a time;
4. in a test cell, keep the evidence as the expected values (``reference`` mode) or judge it
   against them (``graded``, :func:`gpulab.verdict.cell.judge_cell`), and rewrite the cell's
   outputs so that nbgrader scores the verdict: a failing cell starts with a ``GradingError``
   output; a passing one holds no error and no stderr, whatever the kernel printed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from queue import Empty
from typing import Any, Iterator, Sequence

import psutil
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Integer, Unicode

from gpulab.confine.isolation import kill_marked
from gpulab.confine.meter import KernelMeter
from gpulab.course import links
from gpulab.course.execution import after_timeout
from gpulab.course.expected import Expected
from gpulab.course.kernel import MAX_MESSAGE_BYTES, JailedKernelManager
from gpulab.grading.evidence import MIME
from gpulab.verdict.cell import MeasuredRuns, judge_cell, measured_seeds
from gpulab.verdict.rules import Measurement

# enames written into the notebook, and a marker in a capped cell: gpulab.course.notes reads them.
KERNEL_DIED = "DeadKernelError"
NOT_RUN = "NotRunError"
TIMEOUT = "CellTimeoutError"
VERDICT = "GradingError"
OUTPUT_CAPPED = "[gpulab grader: output past the cap was dropped:"
# Opens the line of clean_log that says the kernel filled its folder (gpulab.course.sandbox reads it).
FULL = "[full]"
MAX_RECORDS = 5000               # evidence records per cell
MAX_EVIDENCE_BYTES = 256 * 2**20  # evidence per cell


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An nbformat error output, which nbgrader scores as a failed cell."""
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class SandboxedExecute(Execute):
    """nbgrader's ``Execute`` that survives a dead or unresponsive kernel and decides each test cell
    from evidence."""

    mode = Unicode("graded", help="'graded': judge each test cell against `expected`; 'reference': record the "
                                  "evidence as the expected values (into `reference_out`)").tag(config=True)
    expected = Unicode("", help="the reference run of this lab (gpulab.course.expected.Expected, JSON)").tag(config=True)
    reference_out = Unicode("", help="reference mode: where to write the expected values").tag(config=True)
    timing_secret = Unicode("", help="reference mode: the grading run's secret, for the measured runs' seeds").tag(config=True)
    measure_lock = Unicode("", help="a file every grading job of this machine locks while it measures a kernel's "
                                    "runs, so that one job's measured runs never share the machine with another's").tag(config=True)
    kernel_cgroup = Unicode("", help="the kernel's cgroup folder (its cpu.stat), for measured runs").tag(config=True)
    interrupt_grace = Integer(
        10, help="seconds a kernel has to stop after a cell hits the timeout, before it is killed").tag(config=True)
    clean_dir = Unicode("", help="the kernel's folder: links, FIFOs, devices and hard links are removed from it "
                                 "once the kernel is gone, before nbgrader writes there").tag(config=True)
    clean_log = Unicode("", help="a file where what was removed from clean_dir is listed, one per line").tag(config=True)
    max_output_kb = Integer(1024, help="output kept per cell (text, images, widget state), KiB; past it, "
                                       "outputs are dropped and the cell says so").tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", JailedKernelManager)
        super().__init__(*args, **kwargs)
        self._stopped: str | None = None
        self._reply: dict[str, Any] | None = None
        self._kept: dict[int, int] = {}     # cell index -> output bytes kept
        self._dropped: dict[int, int] = {}  # cell index -> output bytes dropped
        self._records: dict[int, list[Any]] = {}
        self._evidence_bytes: dict[int, int] = {}
        self._overflow: set[int] = set()
        self._expected: Expected | None = None
        self._recorded: dict[str, dict[str, Any]] = {}  # reference mode: grade_id -> cell
        self._notebook = ""
        self._lang: str | None = None

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> tuple[NotebookNode, Any]:
        self._stopped = None
        self._timed_out: int | None = None
        initial = set(os.listdir(self.clean_dir)) if self.clean_dir and os.path.isdir(self.clean_dir) else set()
        self._notebook = ((resources or {}).get("unique_key") or "").rsplit("/", 1)[-1] or \
            (resources or {}).get("metadata", {}).get("name", "")
        if self.mode == "graded" and self.expected:
            self._expected = Expected.load(self.expected)
        lang = nb.metadata.get("gpulab", {}).get("lang") if self.mode == "graded" else None
        self._lang = lang if isinstance(lang, str) else None  # the edition the student worked in (gpulab.i18n)
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
                freed = _make_room(self.clean_dir, initial)
                removed += [f"{FULL} {len(freed)} entries it created ({', '.join(freed[:3])})"] if freed else []
                if removed and self.clean_log:
                    with open(self.clean_log, "a") as log:
                        log.writelines(f"{entry}\n" for entry in removed)
            if self.mode == "reference" and self.reference_out:
                self._save_reference()
            self.log.info("gpulab: nbgrader peak memory %s MiB", _peak_rss_mb())

    def _save_reference(self) -> None:
        path = self.reference_out
        data = json.loads(open(path).read()) if os.path.exists(path) else {}
        data[self._notebook] = self._recorded
        with open(path, "w") as fh:
            json.dump(data, fh)

    # ---- output: evidence is taken out; the rest is kept up to a cap per cell ----

    def output(self, outs: list[NotebookNode], msg: dict[str, Any], display_id: str | None,
               cell_index: int) -> NotebookNode | None:
        content = msg.get("content", {})
        if msg.get("msg_type") == "display_data" and MIME in (content.get("data") or {}):
            self._take_evidence(cell_index, content["data"][MIME], _size(content))
            return None
        size = _size(content)
        cap = self.max_output_kb * 1024
        if msg.get("msg_type") == "error" and size > cap:  # an error is always kept, but not all of it
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

    def _take_evidence(self, cell_index: int, record: Any, size: int) -> None:
        records = self._records.setdefault(cell_index, [])
        used = self._evidence_bytes.get(cell_index, 0) + size
        self._evidence_bytes[cell_index] = used
        if len(records) >= MAX_RECORDS or used > MAX_EVIDENCE_BYTES:
            self._overflow.add(cell_index)
            return
        records.append(record)

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
        self._reply = None
        self._records.pop(index, None)
        try:
            cell, resources = self._run_cell(cell, resources, index)
        finally:
            self._heal_iopub(cell)
        records = self._records.pop(index, [])
        if _is_test(cell):
            self._decide(cell, index, records)
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
        if timed_out and self._timed_out is None:
            self._timed_out = index
        if timed_out and not self._kernel_responds():
            self._kill_kernel()
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
        if self.mode == "reference":
            entries = []
            for k, rec in enumerate(records):
                if isinstance(rec, dict) and rec.get("kind") == "measured":
                    spec = rec.get("spec", {})
                    seeds = measured_seeds(self.timing_secret, self._notebook, gid, k,
                                           int(spec.get("warmup", 1)) + int(spec.get("repeats", 1)))
                    runs = self._measured_runs(rec.get("id"), seeds, int(spec.get("warmup", 1))) \
                        if self._stopped is None else MeasuredRuns(error="stopped")
                    entries.append({"kind": "measured", "spec": spec, "seeds": seeds, "runs": runs.to_json()})
                else:
                    entries.append(rec)
            reference = {"entries": entries, "error": error}
            self._recorded[gid] = reference
            result = judge_cell(reference, [{"kind": e.get("kind"), "value": e.get("value")} for e in entries],
                                {n: MeasuredRuns.from_json(e["runs"]) for n, e in enumerate(entries)
                                 if e.get("kind") == "measured"}, error)
        else:
            reference = self._expected.cell(self._notebook, gid) if self._expected else None
            if reference is None:
                self._write(cell, False, f"the grader has no reference for the test cell {gid!r}", [])
                return
            runs = {}
            for n, (rec, entry) in enumerate(zip(records, reference["entries"])):
                if isinstance(rec, dict) and rec.get("kind") == "measured" and entry.get("kind") == "measured" \
                        and self._stopped is None:
                    spec = entry.get("spec", {})
                    runs[n] = self._measured_runs(rec.get("id"), entry["seeds"], int(spec.get("warmup", 1)))
            result = judge_cell(reference, records, runs, error, self._lang)
        self._write(cell, result.passed, result.message, result.figures, result.note)

    def _write(self, cell: NotebookNode, passed: bool, message: str, figures: list[str], note: str = "") -> None:
        """The cell's outputs as nbgrader must score them: the verdict, then what the cell printed;
        what a human should look at goes in the cell's metadata (gpulab.course.notes reads it)."""
        if note:
            cell.metadata.setdefault("gpulab", {})["note"] = note
        kept = []
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "error" and out.get("ename") in (NOT_RUN, KERNEL_DIED, TIMEOUT) and not passed:
                kept.append(out)
            elif kind == "error":
                continue  # the kernel's own report; the verdict below says what failed
            elif kind == "execute_result":  # a value shown by a test cell is not a score
                out["output_type"] = "display_data"
                out.pop("execution_count", None)
                kept.append(out)
            elif kind == "stream" and out.get("name") == "stderr" and passed:
                out["name"] = "stdout"  # nbgrader scores any stderr 0; the verdict is the grader's
                kept.append(out)
            else:
                kept.append(out)
        if figures:  # the grader's own outputs are marked: the feedback keeps them (gpulab.course.feedback)
            kept.append(NotebookNode(output_type="display_data", metadata={"gpulab": "verdict"},
                                     data={"text/plain": "".join(f"{f}\n" for f in figures)}))
        if not passed:
            if self._timed_out is not None and not _is_timeout(cell):  # the cause, as Validate names it
                message = f"{message or 'failed'} {after_timeout(self._timed_out, self.timeout)}"
            kept.insert(0, error_output(VERDICT, message or "failed"))
        cell.outputs = kept

    # ---- measured runs: requests the grader measures from outside the kernel ----

    def _measured_runs(self, ident: Any, seeds: list[int], warmup: int) -> MeasuredRuns:
        """Run the kernel's measured work ``ident`` once per seed (the first ``warmup`` unmeasured),
        each in a request of its own, and measure each from here: this process's clock and the
        kernel's counters (:class:`gpulab.confine.meter.KernelMeter`). The machine-wide
        :attr:`measure_lock` is held meanwhile."""
        runs = MeasuredRuns()
        if not isinstance(ident, int) or isinstance(ident, bool) or not 0 <= ident < 10_000:
            runs.error = "the cell announced its measured work with a malformed id"
            return runs
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        meter = KernelMeter(pid, self.kernel_cgroup or None) if pid else None
        with _held(self.measure_lock, max(60, 4 * (self.timeout or 0))):
            for i, seed in enumerate(seeds):
                code = f"__import__('gpulab.grading.evidence', fromlist=['run_measured']).run_measured({ident}, {seed})"
                before = meter.read() if meter else None
                try:
                    wall, reply, records = run_sync(self._async_request)(code)
                except DeadKernelError:
                    self._stopped = "the kernel died during a measured run"
                    runs.error = "the kernel died during a measured run"
                    return runs
                used = meter.read() - before if meter else None
                if reply is None:
                    runs.error = f"a measured run did not finish within {max(30, self.timeout or 0)} s"
                    return runs
                if reply.get("status") != "ok":
                    runs.error = f"a measured run raised {str(reply.get('ename'))[:100]}: {str(reply.get('evalue'))[:500]}"
                    return runs
                results = [r for r in records if isinstance(r, dict) and r.get("kind") == "result" and "value" in r]
                if len(results) != 1:
                    runs.error = f"a measured run sent {len(results)} results instead of one"
                    return runs
                if i < warmup:
                    continue
                counts = {} if used is None else {k: getattr(used, k) for k in
                                                  ("cpu_s", "read_chars", "read_calls", "read_bytes", "write_chars")}
                runs.measurements.append(Measurement(wall, **counts))
                runs.results.append(results[0]["value"])
        return runs

    async def _async_request(self, code: str) -> tuple[float, dict[str, Any] | None, list[Any]]:
        """Run ``code`` in the kernel, outside the notebook: (seconds from the request until both the
        reply and the kernel's idle status arrived, the reply's content or None, the evidence sent)."""
        import asyncio

        t0 = time.perf_counter()
        msg_id = await ensure_async(self.kc.execute(code, store_history=False, stop_on_error=False))
        deadline = time.monotonic() + max(30, self.timeout or 0)
        records: list[Any] = []

        async def next_msg(channel: Any) -> dict[str, Any] | None:
            while time.monotonic() < deadline:
                try:
                    return await ensure_async(channel.get_msg(timeout=min(1.0, max(0.01, deadline - time.monotonic()))))
                except Empty:
                    if not await ensure_async(self.kc.is_alive()):
                        raise DeadKernelError("Kernel died") from None
            return None

        async def reply() -> tuple[dict[str, Any] | None, float]:
            while (msg := await next_msg(self.kc.shell_channel)) is not None:
                if msg["parent_header"].get("msg_id") == msg_id:
                    return msg["content"], time.perf_counter()
            return None, time.perf_counter()

        async def idle() -> float | None:
            size = 0
            while (msg := await next_msg(self.kc.iopub_channel)) is not None:
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                content = msg.get("content", {})
                if msg["msg_type"] == "display_data" and MIME in (content.get("data") or {}):
                    size += _size(content)
                    if len(records) < 8 and size <= MAX_EVIDENCE_BYTES:
                        records.append(content["data"][MIME])
                elif msg["msg_type"] == "status" and content.get("execution_state") == "idle":
                    return time.perf_counter()
            return None

        (content, t_reply), t_idle = await asyncio.gather(reply(), idle())
        if content is None or t_idle is None:
            return time.perf_counter() - t0, None, records
        return max(t_reply, t_idle) - t0, content, records

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


@contextlib.contextmanager
def _held(path: str, wait_s: float) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (if given): concurrent grading jobs measure one at a time.
    After ``wait_s`` without it (a job that holds it far too long), measure anyway."""
    if not path:
        yield
        return
    try:
        fh = open(path, "a+")
    except OSError:
        yield
        return
    with fh:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    yield
                    return
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _make_room(folder: str, keep: set[str]) -> list[str]:
    """When the kernel filled its folder (a disk of its own, ``nsinit --quota``), remove what it
    created there so that nbgrader can still save the graded notebook; returns what was removed."""
    import shutil

    try:
        st = os.statvfs(folder)
    except OSError:
        return []
    full = st.f_bavail < 0.05 * st.f_blocks or (st.f_files and st.f_favail < 0.05 * st.f_files)
    if not full:
        return []
    removed = []
    for name in sorted(set(os.listdir(folder)) - keep)[:100_000]:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                continue
        removed.append(name)
    return removed


def _size(content: Any) -> int:
    """About how many bytes a message's content holds (its strings), without serialising it."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, dict):
        return sum(_size(v) for v in content.values())
    if isinstance(content, (list, tuple)):
        return sum(_size(v) for v in content)
    return 8


def _peak_rss_mb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux: VmHWM


def _is_timeout(cell: NotebookNode) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") == TIMEOUT for o in cell.get("outputs", []))


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
