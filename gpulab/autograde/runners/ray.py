"""``make grade RAY_ADDRESS=head:6379``: every submission a Ray task, graded on a node of the cluster in
that node's own sandbox; the head merges each result into the gradebook, once.

A node receives everything as bytes (the lab's files, the gradebook snapshot, the expected values,
the submission), so nodes share no file system with the head, and grades exactly as one machine
does (:func:`gpulab.autograde.runners.one.grade_in_sandbox`, its own layer checks and masks). A node that
dies mid-task loses nothing: Ray runs the task again, and a result is merged only when it arrives.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Iterator

from gpulab.accounts import students
from gpulab.autograde.box import integrity, links, mask
from gpulab.autograde.box.prepare import grading_root
from gpulab.autograde.limits import LabRun, Limits, SandboxResult, measure_lock_file
from gpulab.autograde.runners.one import grade_safely
from gpulab.confine import isolation, jail
from gpulab.labs import LABS

WHOLE_NODE = "gpulab_whole_node"  # a custom resource each grading node offers once: a lab graded alone takes it
RETRIES = 3                       # runs of a task whose node died, before its row says so
MAX_FILE = 256 * 2**20


def task_options(lab: str, limits: Limits, gpus_per_node: float) -> dict[str, Any]:
    """The resources one submission of ``lab`` asks Ray for: CPUs for its ranks, its cgroup's memory,
    GPUs where there are some, and a whole node for a ``timed_alone`` lab."""
    info = next((x for x in LABS if x.id == lab), None)
    devices = info.devices if info else 0
    opts: dict[str, Any] = {"num_cpus": min(4, max(1, devices)), "max_retries": RETRIES}
    if limits.cgroup_memory_mb():
        opts["memory"] = limits.cgroup_memory_mb() * 2**20
    if gpus_per_node and devices:
        opts["num_gpus"] = min(devices, gpus_per_node)
    if info is not None and info.timed_alone:
        opts["resources"] = {WHOLE_NODE: 1}
    return opts


def _files(folder: Path, max_total: int, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    """The regular files under ``folder`` as ``{relative path: bytes}``, links never followed."""
    with tempfile.TemporaryDirectory() as tmp:
        links.copy_regular(folder, Path(tmp) / "x", MAX_FILE, skip=(".ipynb_checkpoints", "__pycache__", *skip),
                           max_total=max_total)
        root = Path(tmp) / "x"
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def lab_bundle(course: Path, template: Path, specs: dict[str, integrity.NotebookSpec], lab: str, limits: Limits,
               run: LabRun) -> dict[str, Any]:
    """What a node needs to grade any submission of ``lab`` (put in Ray's object store once per lab)."""
    from gpulab import __version__

    return {"version": __version__, "lab": lab, "limits": limits, "specs": specs,
            "seed": run.seed, "config": (course / "nbgrader_config.py").read_bytes(),
            "source": _files(course / "source" / lab, 64 * 2**20, skip=("*.ipynb",)),
            "template": template.read_bytes(), "expected": run.expected.read_bytes()}


def bundle(course: Path, lab: str, student: str, limits: Limits) -> dict[str, Any]:
    """One submission's own part: its files."""
    return {"lab": lab, "student": student,
            "submission": _files(course / "submitted" / student / lab, limits.max_submission_mb * 2**20)}


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = (root / rel).resolve()
        if not path.is_relative_to(root.resolve()):
            raise ValueError(f"a bundled file escapes its folder: {rel!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _node() -> str:
    """This node as a row names it: its host, and Ray's node id where several raylets share a host."""
    try:
        import ray

        return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:6]}"
    except Exception:  # not inside a Ray worker
        return socket.gethostname()


def grade_bundle(shared: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The Ray task: grade one bundled submission on this node; returns plain data."""
    from gpulab import __version__

    b = {**shared, **own}
    node = _node()
    lab, student, limits = b["lab"], b["student"], b["limits"]
    if b["version"] != __version__:
        return _failed(student, lab, f"node {node} runs gpulab {__version__}, the head {b['version']}: "
                                     "install the same version on every node")
    plan = isolation.detect(limits.confine_writes, limits.confine_reads)
    if plan.off() and not limits.allow_weaker:
        return _failed(student, lab, f"node {node} refused to grade: {plan.refusal()}")
    root = grading_root(plan.namespaces)
    try:
        course = root / "course"
        (course / "source" / lab).mkdir(parents=True)
        (course / "nbgrader_config.py").write_bytes(b["config"])
        _write(course / "source" / lab, b["source"])
        _write(course / "submitted" / student / lab, b["submission"])
        template = root / "template.db"
        template.write_bytes(b["template"])
        template.chmod(0o600)
        expected = root / "reference" / lab / "expected.json"
        expected.parent.mkdir(parents=True)
        expected.write_bytes(b["expected"])
        binds = mask.write_masks(mask.lab_references(lab), root / "masks" / lab) if plan.namespaces else []
        secrets = jail.repository_secrets(course) if limits.confine_reads else []
        result = grade_safely(course, template, b["specs"], lab, student, root / lab / students.alias(student),
                               limits, threading.Event(), plan, secrets,
                               LabRun(lab, b["seed"], expected, binds, measure_lock_file()))
        if plan.note():
            result.notes.append(f"{plan.note()} (node {node})")
        result.node = node
        out = {"result": {f.name: getattr(result, f.name) for f in fields(result)
                          if f.name not in ("autograded", "log")}, "node": node,
               "autograded": _files(result.autograded, 4 * MAX_FILE) if result.autograded else None,
               "log": result.log.read_bytes()[-4 * 2**20:] if result.log and result.log.is_file() else b""}
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _failed(student: str, lab: str, why: str, node: str | None = None) -> dict[str, Any]:
    result = SandboxResult(student, lab, status="failed", notes=[f"{why}; scored 0"], node=node or _node())
    return {"result": {k: v for k, v in asdict(result).items() if k not in ("autograded", "log")},
            "node": result.node, "autograded": None, "log": b""}


def unpack(data: dict[str, Any], box: Path) -> SandboxResult:
    """A node's answer as a :class:`SandboxResult` whose files lie in ``box`` on the head."""
    result = SandboxResult(**data["result"])
    box.mkdir(parents=True, exist_ok=True)
    if data.get("autograded") is not None:
        result.autograded = box / "autograded"
        _write(result.autograded, data["autograded"])
    result.log = box / "nbgrader.log"
    result.log.write_bytes(data.get("log") or b"")
    return result


class RayGrader:
    """A connection to the cluster at ``address`` that grades bundles and yields results as they arrive."""

    def __init__(self, address: str) -> None:
        from gpulab.hpo.session import import_ray

        self.ray = import_ray()
        fix = ("start one with `ray start --head --port=6379` and `ray start --address=HEAD:6379` on each grading "
               "node, or leave RAY_ADDRESS out to grade on this machine")
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:  # Ray itself waits minutes for a head that is not there
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
        except (OSError, ValueError) as err:
            raise ConnectionError(f"no Ray cluster at {address!r} ({type(err).__name__}: {err}); {fix}") from None
        try:
            self.ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        except ConnectionError as err:
            raise ConnectionError(f"no Ray cluster at {address!r} ({err}); {fix}") from None
        self.remote = self.ray.remote(grade_bundle)
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        self.gpus_per_node = max((n["Resources"].get("GPU", 0) for n in nodes), default=0)
        self.whole_nodes = sum(n["Resources"].get(WHOLE_NODE, 0) for n in nodes)

    def put(self, value: Any) -> Any:
        """``value`` in the cluster's object store, once (a lab's shared bundle)."""
        return self.ray.put(value)

    def run(self, jobs: list[tuple[Any, dict[str, Any], dict[str, Any]]]) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """Submit every ``(lab bundle, bundle, options)``; yield ``(student, lab, answer)`` as they finish
        (a failed row for a task whose node died more than :data:`RETRIES` times)."""
        ray = self.ray
        if any("resources" in opts for _, _, opts in jobs) and not self.whole_nodes:
            raise ValueError(f"no node of the cluster offers the {WHOLE_NODE!r} resource, which a lab graded alone "
                             f"needs: start the grading nodes with --resources='{{\"{WHOLE_NODE}\": 1}}'")
        refs = {self.remote.options(**opts).remote(shared, b): (b["student"], b["lab"]) for shared, b, opts in jobs}
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            student, lab = refs[done[0]]
            try:
                yield student, lab, ray.get(done[0])
            except (ray.exceptions.RayError, OSError) as err:
                why = f"the grading task failed on the cluster ({type(err).__name__}) after {RETRIES} retries"
                yield student, lab, _failed(student, lab, why, node="lost")

    def close(self) -> None:
        self.ray.shutdown()


def grade_on_ray(ray: RayGrader, course: Path, template: Path, specs: dict, runs: dict[str, LabRun],
                 phase: list[tuple[str, str]], limits: Limits, root: Path) -> Iterator[SandboxResult]:
    """Grade ``phase`` on the cluster; results as they arrive, their files under ``root``."""
    shared = {lab_: ray.put(lab_bundle(course, template, specs[lab_], lab_, limits, runs[lab_]))
              for lab_ in sorted({lab_ for _, lab_ in phase})}
    jobs = [(shared[lab_], bundle(course, lab_, s, limits), task_options(lab_, limits, ray.gpus_per_node))
            for s, lab_ in phase]
    for s, lab_, answer in ray.run(jobs):
        yield unpack(answer, root / lab_ / students.alias(s))
