"""What one submission may use (:class:`Limits`, set by ``make grade``'s variables and flags) and
what grading it produced (:class:`SandboxResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Limits:
    """What one submission may use (``make grade``'s variables and flags, docs/instructor.md). Sizes
    are MiB, 0 meaning none. ``cell_timeout_s`` None keeps ``c.Execute.timeout``; ``threads`` None
    is all (the grader sets cores // jobs); ``memory_rlimit`` is "data" (what code allocates) or
    "as" (address space); ``confine_reads`` keeps the course, the gradebook copies and the other
    grading copies unreadable; ``disk_mb`` and ``files_max`` cap each of the kernel's two folders
    (tmpfs of their own); ``allow_weaker`` grades where an OS protection is missing, with a note."""

    wall_s: float = 900.0
    cell_timeout_s: int | None = None
    memory_mb: int = 4096
    memory_rlimit: str = "data"
    fsize_mb: int = 1024
    threads: int | None = None
    interrupt_grace_s: int = 10
    confine_writes: bool = True
    confine_reads: bool = True
    max_notebook_mb: int = 100
    pids_max: int = 1024
    tmp_mb: int = 1024
    shm_mb: int = 1024
    max_output_kb: int = 1024
    max_submission_mb: int = 300
    disk_mb: int = 1024
    files_max: int = 100_000
    allow_weaker: bool = False

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise ValueError(f"wall_s={self.wall_s}: the wall-clock limit must be positive (e.g. 900)")
        if self.cell_timeout_s is not None and self.cell_timeout_s <= 0:
            raise ValueError(f"cell_timeout_s={self.cell_timeout_s}: use a positive number of seconds, or None "
                             "for nbgrader_config.py's c.Execute.timeout")
        if self.memory_mb < 0 or 0 < self.memory_mb < 256:
            raise ValueError(f"memory_mb={self.memory_mb}: a kernel that imports torch needs at least 256 MiB "
                             "(0 turns the limit off)")
        if self.memory_rlimit not in ("data", "as"):
            raise ValueError(f"memory_rlimit={self.memory_rlimit!r}: use 'data' or 'as'")
        if self.max_notebook_mb < 1:
            raise ValueError(f"max_notebook_mb={self.max_notebook_mb}: use at least 1 MiB")
        if self.pids_max < 64:
            raise ValueError(f"pids_max={self.pids_max}: a kernel with torch's threads needs at least 64 tasks")
        if min(self.tmp_mb, self.shm_mb) < 16:
            raise ValueError(f"tmp_mb={self.tmp_mb}, shm_mb={self.shm_mb}: give /tmp and /dev/shm at least 16 MiB each")
        if self.disk_mb < 64 or self.files_max < 1000:
            raise ValueError(f"disk_mb={self.disk_mb}, files_max={self.files_max}: give each submission at least "
                             "64 MiB and 1000 files to write")
        if self.max_output_kb < 16:
            raise ValueError(f"max_output_kb={self.max_output_kb}: keep at least 16 KiB of output per cell")

    def cgroup_memory_mb(self) -> int:
        """The memory cap of the submission's whole cgroup (0: none)."""
        return self.memory_mb + self.tmp_mb + self.shm_mb + 2 * self.disk_mb + NBGRADER_MB if self.memory_mb else 0


# What nbgrader itself may take beside the kernel (it holds the notebook and its outputs).
NBGRADER_MB = 1024


@dataclass
class LabRun:
    """What every submission of one lab shares in a grading run: the seed of its inputs, the reference
    run's expected values and the masked references bound over gpulab's own."""

    lab: str
    seed: int
    expected: Path
    binds: list[tuple[Path, Path]] = field(default_factory=list)
    measure_lock: str = ""  # the machine's lock for measured runs (measure_lock_file)


MEASURE_DIR = Path("/var/tmp/gpulab-measure")


def measure_lock_file(folder: Path = MEASURE_DIR) -> str:
    """The lock every grading job of this machine holds while it measures a kernel's runs (its
    folder, readable by root only, is bound into each sandbox); '' where it cannot be made."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        lock = folder / "lock"
        lock.touch(exist_ok=True)
        return str(lock)
    except OSError:
        return ""


@dataclass
class SandboxResult:
    """What grading one submission produced, before it is merged into the real gradebook."""

    student: str
    lab: str
    status: str = "graded"  # graded | unreadable | missing | failed | timeout
    notes: list[str] = field(default_factory=list)
    grades: dict[tuple[str, str], float | None] = field(default_factory=dict)  # (notebook, cell) -> auto score
    comments: dict[tuple[str, str], str | None] = field(default_factory=dict)
    late_penalties: dict[str, float | None] = field(default_factory=dict)
    timestamp: object = None
    autograded: Path | None = None
    log: Path | None = None
    seconds: float = 0.0
    node: str = ""  # where it was graded, on a Ray cluster (gpulab.autograde.runners.ray)
    landlock: bool | None = None
    peaks: dict[str, int | None] = field(default_factory=dict)
