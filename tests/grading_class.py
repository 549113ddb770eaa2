"""A fixture class for the grading tests: lab 00 submissions built from the release notebook, the
good ones filled in with the source notebook's solutions, the bad ones broken on purpose.

Each case says what the student did, the score it must get (lab 00 has four test cells of 2
points each: to_device_nested, backend_for_machines, placement_for_machines,
triage_doctor_reports), and a piece of the note ``grades.csv`` must carry for it.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from conftest import COURSE

from gpulab.confine.jail import landlock_abi
from gpulab.course.release import release

LAB = "00_setup"
MAX_SCORE = 10.0   # lab 00's points: 8 autograded, 2 for the written answer (graded by hand)
FULL_SCORE = 8.0   # every exercise right: the autograder's full marks (the written answer is left blank)
REPO = str(Path(__file__).resolve().parents[1])  # the checkout: its .git and notebooks/source hold the answers


@dataclass
class Case:
    """One fixture student: solution-cell overrides (None = leave the release stub), test-cell
    edits, and what grading must report."""

    answers: dict[str, str | None] = field(default_factory=dict)
    edit_tests: dict[str, str] = field(default_factory=dict)   # grade_id -> new source
    delete: tuple[str, ...] = ()                               # grade_ids of cells to remove
    unflag: tuple[str, ...] = ()                               # grade_ids whose "grade" flag is cleared
    raw: str | None = None                                     # the file's bytes instead of a notebook
    file_name: str = f"{LAB}.ipynb"
    score: float = FULL_SCORE
    note: str = ""                                             # a regexp the notes must match
    plant: bool = False                                        # links, a FIFO, a hard link beside the notebook
    sparse: bool = False                                       # a 3 GiB sparse file beside the notebook
    extra_cells: tuple[str, ...] = ()                          # code cells of the student's own, at the end
    extra_files: dict[str, str] = field(default_factory=dict)  # other files in the submission folder


WRONG_BACKEND = '''def choose_backend(machine, world_size):
    if not isinstance(world_size, int) or world_size < 1 or world_size % machine.num_nodes:
        raise ValueError("world_size must be a positive int that splits over the nodes")
    return "nccl" if machine.usable_gpus >= world_size // machine.num_nodes else "gloo"   # forgets machine.nccl
'''
# Honest students write their own code: four ways each to write the two long exercises, all right
# (tests/test_grading_class.py checks them against the references), none a copy of another, of the
# course's solution or of gpulab's reference (the similarity check finds no pair among them).
TO_DEVICE = [
'''def to_device(batch, device):
    """Move every tensor in a nested batch to `device`; leave everything else as is."""
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        out = {}
        for key in batch:
            out[key] = to_device(batch[key], device)
        return out
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*[to_device(x, device) for x in batch])
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(x, device) for x in batch)
    return batch
''',
'''def to_device(batch, device):
    """Move every tensor in a nested batch to `device`; leave everything else as is."""
    def move(x):
        return to_device(x, device)
    kind = type(batch)
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device=device, non_blocking=True)
    elif isinstance(batch, dict):
        moved = dict(zip(batch.keys(), map(move, batch.values())))
    elif isinstance(batch, list):
        moved = kind(map(move, batch))
    elif isinstance(batch, tuple):
        parts = list(map(move, batch))
        moved = kind(*parts) if getattr(kind, "_fields", None) is not None else kind(parts)
    else:
        moved = batch
    return moved
''',
'''def to_device(batch, device):
    """Move every tensor in a nested batch to `device`; leave everything else as is."""
    match batch:
        case torch.Tensor():
            return batch.to(device, non_blocking=True)
        case dict():
            return {name: to_device(value, device) for name, value in batch.items()}
        case tuple() if hasattr(type(batch), "_fields"):
            return type(batch)._make(to_device(v, device) for v in batch)
        case list() | tuple():
            items = []
            for v in batch:
                items.append(to_device(v, device))
            return type(batch)(items)
        case _:
            return batch
''',
'''def to_device(batch, device):
    """Move every tensor in a nested batch to `device`; leave everything else as is."""
    stack_types = (list, tuple)
    if isinstance(batch, stack_types):
        children = [to_device(child, device) for child in batch]
        if hasattr(batch, "_asdict"):
            return batch.__class__(*children)
        return batch.__class__(children)
    if isinstance(batch, dict):
        return {k: to_device(batch[k], device) for k in list(batch)}
    return batch.to(device, non_blocking=True) if isinstance(batch, torch.Tensor) else batch
''',
]
TRIAGE = [
'''def triage(facts):
    """The first finding that applies to a machine's facts: a problem code, the note, or 'ok'."""
    def parse(text):
        major, minor = text.split(".")[:2]
        return int(major), int(minor)

    build = facts["torch_cuda_build"]
    driver = facts["driver_cuda_version"]
    gpus = len(facts["gpus"]) > 0 if facts["nvml"] == "ok" else bool(facts["nvidia_smi"])
    if build is None:
        return "cpu-build-on-gpu-machine" if gpus else "ok"
    if driver is not None and parse(driver)[0] < parse(build)[0]:
        return "driver-too-old"
    if gpus and facts["torch_gpu_count"] == 0 and facts["cuda_visible_devices"] is not None:
        return "gpus-hidden"
    if driver is not None and parse(driver) < parse(build):
        return "minor-version-compat"
    return "ok"
''',
'''def triage(facts):
    """The first finding that applies to a machine's facts: a problem code, the note, or 'ok'."""
    nums = lambda v: tuple(map(int, v.split(".")[:2])) if v else None
    b, d = nums(facts["torch_cuda_build"]), nums(facts["driver_cuda_version"])
    if facts["nvml"] == "ok":
        has_gpu = bool(facts["gpus"])
    else:
        has_gpu = facts["nvidia_smi"] is True
    rules = [
        ("cpu-build-on-gpu-machine", lambda: b is None and has_gpu),
        ("driver-too-old", lambda: b is not None and d is not None and d[0] < b[0]),
        ("gpus-hidden", lambda: b is not None and has_gpu and facts["torch_gpu_count"] == 0
                                and facts["cuda_visible_devices"] is not None),
        ("minor-version-compat", lambda: b is not None and d is not None and d < b),
    ]
    for code, applies in rules:
        if applies():
            return code
    return "ok"
''',
'''def triage(facts):
    """The first finding that applies to a machine's facts: a problem code, the note, or 'ok'."""
    result = "ok"
    nvidia = (facts["nvml"] == "ok" and len(facts["gpus"]) >= 1) or (facts["nvml"] != "ok" and facts["nvidia_smi"])
    cuda = facts["torch_cuda_build"]
    drv = facts["driver_cuda_version"]
    if not cuda:
        if nvidia:
            result = "cpu-build-on-gpu-machine"
    else:
        have = [int(p) for p in drv.split(".")[:2]] if drv else None
        want = [int(p) for p in cuda.split(".")[:2]]
        if have is not None and have[0] < want[0]:
            result = "driver-too-old"
        elif nvidia and not facts["torch_gpu_count"] and facts["cuda_visible_devices"] is not None:
            result = "gpus-hidden"
        elif have is not None and have < want:
            result = "minor-version-compat"
    return result
''',
'''def triage(facts):
    """The first finding that applies to a machine's facts: a problem code, the note, or 'ok'."""
    from packaging.version import Version

    gpus_present = (len(facts["gpus"]) if facts["nvml"] == "ok" else int(bool(facts["nvidia_smi"]))) > 0
    built_for, driver_for = facts["torch_cuda_build"], facts["driver_cuda_version"]
    if built_for is None and gpus_present:
        return "cpu-build-on-gpu-machine"
    if built_for is None:
        return "ok"
    b, d = Version(built_for), (Version(driver_for) if driver_for else None)
    if d is not None and d.major < b.major:
        return "driver-too-old"
    if gpus_present and facts["torch_gpu_count"] == 0 and facts["cuda_visible_devices"] is not None:
        return "gpus-hidden"
    if d is not None and (d.major, d.minor) < (b.major, b.minor):
        return "minor-version-compat"
    return "ok"
''',
]


def honest(i: int) -> dict[str, str]:
    """The answers of honest student ``i`` (0-3): their own to_device and triage, and the short exercises."""
    return {"to_device_impl": TO_DEVICE[i], "triage_impl": TRIAGE[i]}


ESCAPE = '''import os, pathlib
for target in [{course!r} + "/ESCAPED.txt", {repo!r} + "/ESCAPED.txt", "../../../ESCAPED.txt"]:
    try:
        pathlib.Path(target).write_text("owned")
    except OSError as err:
        print("refused:", type(err).__name__)
os.system("echo owned > " + {course!r} + "/ESCAPED_SHELL.txt 2>/dev/null")
import subprocess
subprocess.Popen(["sleep", "600"], start_new_session=True)  # detached: must not outlive grading
os.system("sleep 601 &")  # orphaned to init: must not outlive grading either
'''
PEEK = '''for target in [{course!r} + "/source/00_setup/00_setup.ipynb", "../../../gradebook.db"]:
    try:
        open(target, "rb").read()
        print("read", target)
    except OSError as err:
        print("refused:", type(err).__name__)
import os, subprocess
print(subprocess.run(["cat", {course!r} + "/source/00_setup/00_setup.ipynb"], capture_output=True, text=True).stdout)
os.system("cat " + {course!r} + "/source/00_setup/00_setup.ipynb > copied.ipynb 2>/dev/null")  # a stray notebook
'''
STUBBORN = '''import time
while True:
    try:
        time.sleep(0.5)
    except KeyboardInterrupt:
        pass
'''
# it lets go when the cap stops it: a hog that kept ~1.5 GiB would starve the cells after it by
# chance (CI once saw cell 31 die of it, and the score fall to 4), and this case is about the
# hog's own cell: its MemoryError, its marks, and the note that names it
HOG = '''blocks = []
try:
    while True:
        blocks.append(bytearray(64 * 2**20))
finally:
    blocks.clear()
'''


# ---- the red-team of issue 15: each on a blank notebook (0/8 without the attack) ----
BLANK = {"to_device_impl": None, "choose_backend_impl": None, "place_ranks_impl": None, "triage_impl": None}
FREE_MARKS = {
    "fake_helpers": """import gpulab.grading as g
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
for name in ("check", "check_equal", "check_close", "check_shape", "check_between", "check_raises", "check_not_calling"):
    setattr(g, name, lambda *a, **k: Anything())
def to_device(batch, device): return Anything()
""",
    "success_patch": """from IPython.core.interactiveshell import ExecutionResult
ExecutionResult.success = property(lambda self: True)
get_ipython().showtraceback = lambda *a, **k: None
def to_device(batch, device): return batch
""",
    "transformer": """def empty_tests(lines):
    return [] if "grading." in "".join(lines) else lines
get_ipython().input_transformers_cleanup.append(empty_tests)
def to_device(batch, device): return batch
""",
    "displayhook": """import sys
def to_device(batch, device):
    sys.displayhook(-1)  # nbgrader reads a negative first output as full marks
    return batch
""",
    "builtins_patch": """import builtins, torch
_real = builtins.isinstance
builtins.isinstance = lambda obj, cls: _real(obj, cls)  # the same answers, until the tests ask
torch.testing.assert_close = lambda *a, **k: None
def to_device(batch, device): return batch
""",
    "grader_patch": """from gpulab.grading import lab00
import gpulab.devices.doctor as doctor
lab00.REFERENCES = ()  # too late: the masks were bound before the kernel started
doctor.diagnose = lambda facts: []  # and the doctor the tests compare with would find nothing
def to_device(batch, device): return batch
""",
}
# What the grader can see of each: the scan's pattern where it matches; where nothing is visible the
# attack only has to earn nothing (the kernel's claims decide no verdict any more).
FREE_MARKS_NOTES = {"fake_helpers": "", "success_patch": r"only tampering", "transformer": r"only tampering",
                    "displayhook": r"only tampering", "builtins_patch": r"only tampering", "grader_patch": ""}
PROFILER_OFF = {"choose_backend_impl": """import sys
from gpulab import devices as _gd
def choose_backend(machine, world_size):
    sys.setprofile(None)  # a profiler once watched for calls to the reference
    return _gd.choose_backend(machine, world_size)
""", "place_ranks_impl": """import types
from gpulab import devices as _gd
_copy = types.FunctionType(_gd.place_ranks.__code__.replace(co_name="mine"), _gd.place_ranks.__globals__)
def place_ranks(machine, world_size):
    return _copy(machine, world_size)  # a copy of the reference is the reference
"""}
RELINK = """import os
for name, target in [("00_setup.ipynb", {classmate!r}), ("zero.ipynb", "/dev/zero"), ("src", {source!r})]:
    if os.path.lexists(name):
        os.remove(name)
    os.symlink(target, name)
os.mkfifo("pipe.ipynb")
"""
KILLER = """import os, signal
for pid in (os.getppid(), {grader}):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as err:
        print("refused:", type(err).__name__)
{solution}"""
LEAK = """import inspect, linecache
_stash = []
def choose_backend(machine, world_size):
    caller = inspect.currentframe().f_back
    _stash.append("".join(linecache.getlines(caller.f_code.co_filename)))
    print(_stash[-1])  # the hidden tests, printed from inside the test cell
    if machine.nccl and machine.usable_gpus >= world_size >= 1:
        return "nccl"
    if world_size < 1:
        raise ValueError("world_size")
    return "gloo"
"""
LEAK_LATER = """print(_stash[0] if _stash else "nothing stashed")  # ... and again in a cell of its own
def place_ranks(machine, world_size):
    raise ValueError(_stash[0] if _stash else "nothing")  # ... and as an error message
"""


# ---- issue 15's resource and escape attacks: each on a full-marks notebook (8/10 without the attack) ----
FORK_BOMB = """import os, time
def spawn(depth):
    born = 0
    for _ in range(64):
        try:
            pid = os.fork()
        except OSError:
            return born  # the process cap
        if pid == 0:  # every child forks on, then sleeps: it must not outlive the submission
            try:
                if depth < 2:
                    spawn(depth + 1)
                time.sleep(3600)
            finally:
                os._exit(0)
        born += 1
    return born
print("forked", spawn(0))
"""
SHM_FILL = """import os
chunk, written = b"x" * 2**26, 0
for folder in ("/dev/shm", "/tmp"):
    try:
        with open(folder + "/gpulab-fill-{tag}", "wb") as fh:
            while written < 2 * 2**30:  # 2 GiB
                fh.write(chunk)
                written += len(chunk)
    except OSError as err:
        print(folder, "full after", written >> 20, "MiB:", type(err).__name__)
"""
SPARSE = """import os
for name in ("a.bin", "b.bin", "c.bin", "extra.ipynb"):
    with open(name, "wb") as fh:
        fh.truncate(1000 * 2**20)  # 4 x 1000 MiB that hold nothing: 3.9 GiB to a naive copy
try:
    with open(os.environ.get("TMPDIR", "/tmp") + "/huge.bin", "wb") as fh:
        fh.truncate(3 * 2**30)
except OSError as err:
    print("3 GiB file refused:", type(err).__name__)
"""
FLOOD = """import sys
line = "x" * (2**20 - 1)
for _ in range(200):  # 200 MB of output
    print(line)
"""
DETACHED = """import os, subprocess
env = {{k: v for k, v in os.environ.items() if k != "GPULAB_SANDBOX"}}  # the marker dropped
subprocess.Popen(["sleep", "{tag}"], start_new_session=True, env=env)
if os.fork() == 0:  # a double-forked daemon in a session of its own
    os.setsid()
    if os.fork() == 0:
        os.execvpe("sleep", ["sleep", "{tag}"], env)
    os._exit(0)
os.wait()
"""
TIOCSTI = """import fcntl, glob, os, termios
hit = []
for path in ["/dev/tty", {terminal!r}, *glob.glob("/dev/pts/*"), "/dev/console",
             *(f"/proc/{{pid}}/fd/{{fd}}" for pid in ("1", str(os.getppid())) for fd in (0, 1, 2))]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        for ch in "echo owned > /tmp/TIOCSTI_RAN\\n":
            fcntl.ioctl(fd, termios.TIOCSTI, ch.encode())
        hit.append(path)
    except OSError as err:
        pass
    finally:
        os.close(fd)
print("typed into", hit or "nothing")
"""
SNOOP = """import glob, os, pathlib, subprocess
root = pathlib.Path.cwd().parents[4]  # <grading folder>/00_setup/<me>/autograded/<me>/00_setup
targets = [str(root / "00_setup" / mate / name) for mate in ("good_ana", "good_ben", "hidden_fail")
           for name in ("gradebook.db", "submitted/{{0}}/00_setup/00_setup.ipynb".format(mate), "tmp/runtime")]
targets += glob.glob(str(root / "00_setup" / "*" / "tmp" / "runtime" / "kernel-*.json"))  # classmates' kernels
targets += [{repo!r} + "/.git", {repo!r} + "/.git/HEAD", {repo!r} + "/notebooks/source/00_setup/00_setup.ipynb",
            {course!r} + "/source/00_setup/00_setup.ipynb"]
for target in targets:
    try:
        data = open(target, "rb").read()
        print("LEAK", target, len(data))
    except OSError as err:
        print("refused:", type(err).__name__)
for cmd in (["git", "-C", {repo!r}, "show", "HEAD:notebooks/source/00_setup/00_setup.ipynb"],
            ["cat", {repo!r} + "/notebooks/source/00_setup/00_setup.ipynb"]):
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    print("LEAK" if "BEGIN SOLUTION" in out or "BEGIN HIDDEN" in out else "refused:", cmd[0])
"""


def attack_cases(course: Path, terminal: str, tag: str) -> dict[str, Case]:
    """The resource and escape attacks of issue 15 (OS isolation). ``terminal`` is a terminal the
    grader holds (a TIOCSTI target); ``tag`` marks what the attacks leave (a file name, a sleep)."""
    repo = REPO
    full = "\n{solution}"
    return {
        "fork_bomb": Case(answers={"to_device_impl": FORK_BOMB + full}, note=r"hit the cap of \d+ processes"),
        "shm_filler": Case(answers={"to_device_impl": SHM_FILL.format(tag=tag) + full},
                           note=r"filled its private /dev/shm"),
        "sparse": Case(answers={"to_device_impl": SPARSE + full}, sparse=True,
                       note=r"not copied: big.bin \(larger than 100 MiB\).*left \d+ MiB of files in its"),
        "flood": Case(answers={"to_device_impl": FLOOD + full}, note=r"printed too much output; dropped"),
        "detached": Case(answers={"to_device_impl": DETACHED.format(tag=tag) + full},
                         note=r"process\(es\) it started outlived its kernel \(sleep\)"),
        "tiocsti": Case(answers={"to_device_impl": TIOCSTI.format(terminal=terminal) + full}, note=r"uses ioctl"),
        "snoop": Case(answers={"to_device_impl": SNOOP.format(repo=repo, course=str(course)) + full},
                      note=r"tried to read the instructor's files: .*gradebook.db"),
    }


def cases(course: Path) -> dict[str, Case]:
    """The fixture class (28 students) for a course copy at ``course``: 17 of issue 7's grader tests,
    11 of issue 15's red-team (tampering with the tests' tools or the lab's graders, links, a kill of the
    grader, leaking tests into feedback); :func:`attack_cases` adds the OS-isolation attacks,
    :func:`evidence_cases` the attacks on verdicts and :func:`pipeline_cases` those on the pipeline."""
    return {
        "good_ana": Case(answers=honest(0)), "good_ben": Case(answers=honest(1)), "good_cho": Case(answers=honest(2)),
        "partial": Case(answers={"to_device_impl": None, "place_ranks_impl": None, "triage_impl": None}, score=2),
        "hidden_fail": Case(answers={**honest(3), "choose_backend_impl": WRONG_BACKEND}, score=6),
        "edited_test": Case(answers={"choose_backend_impl": "def choose_backend(machine, world_size):\n    return 'gloo'"},
                            edit_tests={"backend_for_machines": "pass  # trust me"}, score=6,
                            note=r"test cell backend_for_machines was edited; graded with the original"),
        "deleted_tests": Case(delete=("place_ranks_impl", "placement_for_machines"), score=6,
                              note=r"test cell placement_for_machines was deleted; restored"),
        "unflagged_test": Case(answers={"triage_impl": "def triage(report):\n    return 'ok'"},
                               unflag=("triage_doctor_reports",), score=6, note=r"triage_doctor_reports: nbgrader flags grade"),
        "infinite_loop": Case(answers={"to_device_impl": "while True:\n    pass"}, score=6,
                              note=r"cell \d+ \(to_device_impl\) stopped at the \d+ s cell time limit"),
        "stubborn_loop": Case(answers={"choose_backend_impl": STUBBORN}, score=2,
                              note=r"choose_backend_impl\) ran past the 20 s cell time limit, ignored the interrupt, and its kernel was stopped; 7 later cell\(s\) of 00_setup.ipynb were not run"),
        "memory_hog": Case(answers={"place_ranks_impl": HOG}, score=6, note=r"place_ranks_impl\) ran out of memory"),
        "os_exit": Case(answers={"choose_backend_impl": "import os\nos._exit(3)"}, score=2,
                        note=r"the kernel died in cell \d+ \(choose_backend_impl\)"),
        "sigkill": Case(answers={"triage_impl": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"}, score=6,
                        note=r"the kernel died in cell \d+ \(triage_impl\)"),
        "escapee": Case(answers={"to_device_impl": ESCAPE.format(course=str(course), repo=REPO) + "\n{solution}"},
                        # the checkout's own path is refused by Landlock, or read-only where the checkout
                        # is bound back under a hidden /tmp (then not written, and not listed)
                        note=r"tried to write outside its folder: (.*/ESCAPED.txt, )?<grading copy>/ESCAPED.txt \(refused\)"),
        "peeker": Case(answers={"choose_backend_impl": PEEK.format(course=str(course)) + "\n{solution}"},
                       note=r"tried to read the instructor's files: .*/source/00_setup/00_setup.ipynb, "
                            r"<grading copy>/gradebook.db \(refused\)"),
        "not_json": Case(raw='{"cells": [ this is not json', score=0, note=r"not valid JSON.*resubmit"),
        "wrong_name": Case(file_name="Untitled.ipynb", score=0, note=r"no 00_setup.ipynb in the submission"),
        **{f"tamper_{name}": Case(answers={**BLANK, "to_device_impl": code}, score=0,
                                  note=FREE_MARKS_NOTES[name]) for name, code in FREE_MARKS.items()},
        "tamper_profiler_off": Case(answers={**BLANK, **PROFILER_OFF}, score=0,
                                    note=r"setprofile/settrace.*|.*masked while grading"),
        "relinker": Case(answers={**BLANK, "to_device_impl": RELINK.format(
            classmate=str(course / "submitted" / "good_ana" / LAB / f"{LAB}.ipynb"), source=str(course / "source"))},
            score=0, note=r"left links or special files in its folder, removed unread"),
        "planted": Case(answers=BLANK, plant=True, score=0, note=r"the submission held links or special files"),
        **({"killer": Case(answers={"to_device_impl": KILLER.format(grader=os.getpid(), solution="{solution}")},
                           note=r"tried to send signal to pid")} if landlock_abi() >= 6 else {}),
        # its choose_backend also takes world_size=2.0, which the hidden tests refuse: 4, not 6
        "leaker": Case(answers={"choose_backend_impl": LEAK, "place_ranks_impl": LEAK_LATER}, score=4,
                       note=r"the callers. frames"),
    }


def make_course(dst: Path) -> Path:
    """A private copy of the course with lab 00 released (and registered in its gradebook)."""
    shutil.copytree(COURSE / "source", dst / "source")
    shutil.copy(COURSE / "nbgrader_config.py", dst / "nbgrader_config.py")
    release(dst, LAB)
    return dst


def _solutions(course: Path) -> dict[str, str]:
    """The source's solution code by grade id (the written answer is not among them: every case leaves
    it as released, so autograding gives it 0 and leaves no note that it waits for the instructor)."""
    nb = nbformat.read(str(course / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    out = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            out[meta["grade_id"]] = re.sub(r"\n?\s*### (BEGIN|END) SOLUTION", "", cell.source)
    return out


def student_notebook(course: Path, case: Case) -> nbformat.NotebookNode:
    """The release notebook with the case's answers and edits applied."""
    nb = nbformat.read(str(course / "release" / LAB / f"{LAB}.ipynb"), as_version=4)
    solutions = _solutions(course)
    kept = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if gid in case.delete:
            continue
        if meta.get("solution"):
            answer = case.answers.get(gid, solutions.get(gid))
            if answer is not None:
                cell.source = answer.replace("{solution}", solutions[gid])
        if gid in case.edit_tests:
            cell.source = case.edit_tests[gid]
        if gid in case.unflag:
            meta["grade"] = False
        kept.append(cell)
    nb.cells = kept + [nbformat.v4.new_code_cell(src) for src in case.extra_cells]
    return nb


def submit_class(course: Path, chosen: dict[str, Case]) -> None:
    """Write every case into ``submitted/<student>/00_setup/``."""
    for student, case in chosen.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        if case.raw is not None:
            (folder / case.file_name).write_text(case.raw)
        else:
            nbformat.write(student_notebook(course, case), str(folder / case.file_name))
        for name, text in case.extra_files.items():
            (folder / name).write_text(text)
        if case.plant:  # what a hand-made archive can hold: links out of the folder, a FIFO, a hard link
            (folder / "zero.ipynb").symlink_to("/dev/zero")
            (folder / "source").symlink_to(course / "source")
            os.mkfifo(folder / "pipe.ipynb")
            os.link(course / "source" / LAB / f"{LAB}.ipynb", folder / "answers.ipynb")  # the solutions
        if case.sparse:  # 3 GiB that hold nothing: a naive copy writes all of it, twice
            with open(folder / "big.bin", "wb") as fh:
                fh.truncate(3 * 2**30)


# ---- the verdicts issue's adversarial class: every layer of the kernel rewritten, evidence forged ----
MIME = "application/vnd.gpulab.evidence+json"
REPLY_FORGER = """sess = get_ipython().kernel.session
_send = sess.send
def _forged(stream, msg_or_type, content=None, parent=None, *args, **kwargs):
    kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type.get("header", {}).get("msg_type", "")
    if kind == "error":
        return None  # no error ever reaches the grader
    if kind == "execute_reply" and isinstance(content, dict):
        content = dict(content, status="ok")  # every cell succeeded
    return _send(stream, msg_or_type, content, parent, *args, **kwargs)
sess.send = _forged
def to_device(batch, device):
    return batch
"""
GUESSER = """from IPython.display import display
def _guess(info):
    if "grading." in (info.raw_cell or ""):  # a test cell: send values that look right, computed from nothing
        for v in ["meta", True, "name", 3, "nccl", "gloo", ["cuda:0", "cuda:1"], "ok"] * 5:
            display({%r: {"kind": "check", "value": v}, "text/plain": ""}, raw=True)
get_ipython().events.register("pre_run_cell", _guess)
def to_device(batch, device):
    return batch
""" % MIME
DOUBLER = """import gpulab.evidence.wire as _ev
_emit = _ev.emit
def _twice(record):
    _emit(record)
    _emit(record)  # every value sent twice
_ev.emit = _twice
{solution}"""
WRONG_TYPE = """import gpulab.evidence.wire as _ev
from IPython.display import display as _display
_ev.emit = lambda record: _display({_ev.MIME: {"kind": "check", "value": {"$pickle": "gASVAAAAAAAAAACMBHRydWWULg=="}},
                                    "text/plain": ""}, raw=True)
{solution}"""
HUGE = """from IPython.display import display
display({%r: {"kind": "check", "value": "x" * (40 * 2**20)}, "text/plain": ""}, raw=True)  # 40 MiB of evidence
{solution}""" % MIME
LIARS = {
    "to_device_impl": """import torch
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __float__(self): return 1.0
    def __index__(self): return 3
    def __getitem__(self, key): return self
    def __getattr__(self, name): return self
    def __array__(self, *a, **k):
        import numpy
        return numpy.zeros(3)
class Sneaky(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return float("nan")
def to_device(batch, device):
    return Anything() if not torch.is_tensor(batch) else torch.empty(0).as_subclass(Sneaky)
""",
    "choose_backend_impl": """class Liar(str):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = str.__hash__
def choose_backend(machine, world_size):
    return Liar("nccl")
""",
    "place_ranks_impl": """class Yes(list):
    def __eq__(self, other): return True
def place_ranks(machine, world_size):
    return Yes([float("nan")] * 2)
""",
    "triage_impl": """class Liar(str):
    def __eq__(self, other): return True
    __hash__ = str.__hash__
def triage(facts):
    return Liar("ok")
""",
}
TRACER = """import ctypes, sys, threading
def _tracer(frame, event, arg):  # while a check runs, hand it the expected value as the student's
    if event == "call" and frame.f_code.co_name in ("check_equal", "check_close", "_check"):
        loc = frame.f_locals
        if "expected" in loc and type(loc["expected"]).__name__ != "Lazy":
            loc["actual"] = loc["expected"]
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
    return None
sys.settrace(_tracer)
threading.settrace(_tracer)
def to_device(batch, device):
    return batch
"""
SILENCER = """import os
import gpulab.grading.checks
os.environ["GPULAB_GRADING"] = "interactive"  # decide in the kernel instead of sending evidence ...
gpulab.grading.checks.judge.verdict = lambda *a, **k: None  # ... and decide that everything passes
def to_device(batch, device):
    return batch
"""
MASKED_CALLS = {
    "choose_backend_impl": """from gpulab.devices.machine import choose_backend as _reference
def choose_backend(machine, world_size):
    return _reference(machine, world_size)
""",
    "triage_impl": """from gpulab.devices import doctor as _doctor
def triage(facts):
    found = [p.code for p in _doctor.diagnose(_doctor.Facts(**facts))]
    return found[0] if found else "ok"
""",
}
GETSOURCE = """import inspect, typing
from gpulab.devices import batches as _batches
_ns = {"torch": __import__("torch"), "Any": typing.Any, "Callable": typing.Callable}
exec(inspect.getsource(_batches.tree_map), _ns)  # the reference's source, from its file
def to_device(batch, device):
    return _ns["tree_map"](lambda t: t.to(device), batch)
"""


# issue 48: the forge. The graded kernel holds no expected value, so it sends what it can compute
# itself as if it were the reference run's: every check rewritten (through the module's dict, no
# attribute assignment to see) to send its value with a spec of open bounds and itself as the literal
# expected; the kernel's mode set to the reference's; the answers computed by the lab's grading module
# (gpulab's references behind it); and the reference run's file written where a grader might read it.
FORGE = {
    "to_device_impl": """import os
from gpulab.evidence import wire as _wire
from gpulab.evidence.records import Check as _Check
from gpulab.grading import checks as _checks
from gpulab.grading import lab00 as _lab00

def _forged(spec, actual, expected=_checks.NOT_GIVEN):
    value = actual()  # the check as the reference kernel sends it: any value passes, and this one is expected
    _wire.emit(_Check(value, {**spec, "kind": "between", "lo": None, "hi": None}, value))
vars(_checks)["_check"] = _forged
os.environ["GPULAB_GRADING"] = "reference"  # every other check sends a spec too, as the reference kernel's do
def to_device(batch, device):
    return _lab00.tree_map(lambda t: t.to(device), batch)  # the grading module's own walker
""",
    "choose_backend_impl": """def choose_backend(machine, world_size):
    return _lab00.choose_backend(machine, world_size)  # what the reference computes
""",
    "place_ranks_impl": """def place_ranks(machine, world_size):
    return _lab00.place_ranks(machine, world_size)
""",
    "triage_impl": """import json, pathlib
from gpulab.devices.doctor import Facts as _Facts
def triage(facts):
    return _lab00.doctor_says(_Facts(**facts))
_open = {"kind": "between", "what": "forged", "hint": "", "lo": None, "hi": None}
_file = {"version": 2, "lab": "00_setup", "seed": int(os.environ.get("GPULAB_SEED") or 0), "cpus": 1, "seconds": 0.0,
         "cells": {"00_setup": {gid: {"entries": [{"kind": "check", "value": True, "spec": _open}] * 20}
                                for gid in ("to_device_nested", "backend_for_machines", "placement_for_machines",
                                            "triage_doctor_reports")}}}
for _folder in [pathlib.Path.cwd(), *list(pathlib.Path.cwd().parents)[:5]]:
    try:
        (_folder / "expected.json").write_text(json.dumps(_file))  # the reference run's file, forged
        print("wrote", _folder / "expected.json")
    except OSError as err:
        print("refused:", type(err).__name__)
""",
}


def pasted_reference() -> str:
    """gpulab's tree_map pasted in as the student's own, and to_device written around it."""
    import inspect

    from gpulab.devices.batches import tree_map

    return ("from typing import Any, Callable\n\n\n" + inspect.getsource(tree_map) +
            "\n\ndef to_device(batch, device):\n    return tree_map(lambda t: t.to(device, non_blocking=True), batch)\n")


def evidence_cases() -> dict[str, Case]:
    """The verdicts issue's attacks from inside the kernel: rewritten replies and messages, patched
    checks and comparisons (for good, or only while a check runs), objects that lie, forged,
    doubled, malformed and enormous evidence, calls to the masked references and a pasted one, and the
    forge (expected values computed in the kernel and sent as the reference run's).
    Each on a blank notebook (0/8) unless it says otherwise."""
    return {
        "forge_replies": Case(answers={**BLANK, "to_device_impl": REPLY_FORGER}, score=0),
        "forge_guesses": Case(answers={**BLANK, "to_device_impl": GUESSER}, score=0,
                              note=r"more value\(s\) than its checks make"),
        "forge_doubled": Case(answers={"to_device_impl": DOUBLER}, score=0, note=r"more value\(s\) than its checks make"),
        "forge_wrong_type": Case(answers={"to_device_impl": WRONG_TYPE}, score=0, note=r"could not be read"),
        "forge_huge": Case(answers={"to_device_impl": HUGE}, note=r"printed too much output"),
        "lying_objects": Case(answers=LIARS, score=0),
        "trace_checks": Case(answers={**BLANK, "to_device_impl": TRACER}, score=0, note=r"setprofile/settrace"),
        "silence_checks": Case(answers={**BLANK, "to_device_impl": SILENCER}, score=0,
                               note=r"attribute assignment on gpulab/torch modules"),
        "call_masked": Case(answers={**BLANK, **MASKED_CALLS}, score=0, note=r"masked while grading"),
        "forge_expected": Case(answers=FORGE, score=0),
        "getsource_masked": Case(answers={**BLANK, "to_device_impl": GETSOURCE}, score=0,
                                 note=r"masked while grading"),
        "paste_reference": Case(answers={"to_device_impl": pasted_reference()},  # the rest as the attackers' (not an honest student's)
                                note=r"to_device_impl (is \d+% the same as|holds \d+% of) gpulab's reference "
                                     r"gpulab.devices.batches.tree_map"),
    }


# ---- the pipeline issue's red-team: disk and files, the environment, other clones, feedback, ids ----
DISK_FILL = """try:
    with open("big.bin", "wb") as fh:
        while True:
            fh.write(b"x" * 2**22)
except OSError as err:
    print("disk full:", type(err).__name__)
{solution}"""
FILE_FILL = """import os
os.makedirs("many", exist_ok=True)
for i in range(10**6):
    try:
        open(f"many/{i}", "w").close()
    except OSError as err:
        print("files refused after", i, type(err).__name__)
        break
{solution}"""
ENV_SNOOP = """import os
print(sorted(os.environ.items()))
{solution}"""
CLONE_HUNT = """import os
found = []
for top in ("/opt", "/srv", "/home", "/root", "/mnt", "/media", "/var", "/work", {clone_parent!r}):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in filenames:
            if name == "00_setup.ipynb":  # the course's lab 00, with its hidden tests and solutions
                try:
                    if "BEGIN HIDDEN TESTS" in open(os.path.join(dirpath, name), errors="replace").read():
                        found.append(os.path.join(dirpath, name))
                except OSError:
                    pass
print("LEAK" if found else "no clone found", found[:3])
{solution}"""
HISTORY_LEAK = "import base64\nprint(base64.b64encode(repr(In).encode()).decode())"
# issue 48 item 4: both passed the decoding filters the feedback had; the page no longer shows the graded run
HISTORY_PREFIX = 'print("\\n".join("|" + line for cell in In for line in cell.splitlines()))'
HISTORY_B85 = "import base64, zlib\nprint(base64.b85encode(zlib.compress(repr(In).encode())).decode())"
AUDIT_ERASE = """import os
args = open("/proc/self/cmdline", "rb").read().split(b"\\0")
fd = int(args[args.index(b"--audit-fd") + 1]) if b"--audit-fd" in args else None
if fd is not None:
    try:
        os.ftruncate(fd, 0)
    except OSError as err:
        print("cannot truncate:", type(err).__name__)
    os.close(fd)  # the audit trail ends here ...
import time
time.sleep(3)
for target in ("/etc/gpulab-owned", "../../../owned"):  # ... and these refusals would be logged to it
    try:
        open(target, "w").write("x")
    except OSError as err:
        print("refused:", type(err).__name__)
{solution}"""


def pipeline_cases(clone_parent: str) -> dict[str, Case]:
    """The pipeline issue's attacks and its false positive, each on a full-marks notebook: filling
    the disk and the table of files, reading the grader's environment, hunting a clone of the
    course elsewhere on the machine, leaking the hidden tests through IPython's history, a second
    notebook nested too deep to parse, a student's line that a hidden one is part of, erasing the
    audit trail, and student ids that nbgrader or a spreadsheet would misread."""
    nested = "[" * 200_000 + "]" * 200_000
    return {
        "disk_filler": Case(answers={"to_device_impl": DISK_FILL}, note=r"filled its folder \(a disk of its own"),
        "file_filler": Case(answers={"to_device_impl": FILE_FILL}, note=r"filled its folder \(a disk of its own"),
        "env_snoop": Case(answers={"to_device_impl": ENV_SNOOP}),
        "clone_hunter": Case(answers={"to_device_impl": CLONE_HUNT.format(clone_parent=clone_parent, solution="{solution}")}),
        "history_leaker": Case(extra_cells=(HISTORY_LEAK,)),
        "history_prefix": Case(extra_cells=(HISTORY_PREFIX,)),
        "history_b85": Case(extra_cells=(HISTORY_B85,)),
        "nested_notebook": Case(extra_files={"notes.ipynb": nested}, note=r"notes.ipynb is not part of 00_setup"),
        "nested_lab": Case(raw=nested, score=0, note=r"nested too deeply"),
        "own_itertools": Case(extra_cells=("import itertools as it\nprint(list(it.islice('ab', 1)))",)),
        "audit_eraser": Case(answers={"to_device_impl": AUDIT_ERASE}, note=r"closed its audit log while the kernel ran"),
        "-rf": Case(), "=SUM(1+1)": Case(), "star*": Case(), "new\nline": Case(),
    }
