"""What ``make hub`` writes before JupyterHub starts: the exchange, each role's Jupyter settings,
and the plan (one JSON file the hub's configuration and spawner read).

    <state>/                    root's, mode 0711 (users may pass through to jupyter/, not list it)
        plan.json               the roster, the shares, the paths, the network settings
        jupyterhub_config.py    two lines: gpulab.hub.config.apply(c, plan.json)
        jupyterhub.sqlite, jupyterhub_cookie_secret      JupyterHub's own (0600, made so here)
        jupyter/student/        a student's settings (JUPYTER_CONFIG_PATH), readable by all
        jupyter/instructor/     an instructor's settings
        new-passwords.csv       the accounts CREATE_USERS=1 made (0600)
    <exchange>/                 nbgrader's exchange: 1777 (anyone may create, nobody may delete another's)

**The course id is set once**: it is read from the course's ``nbgrader_config.py`` and written into
both roles' settings, so students' fetches and submits, and the instructor's releases, all name
the same course. **Students** see nbgrader's Assignment List (fetch, submit, fetch feedback) and
Validate; the instructor's tools (Formgrader, Create Assignment, Course List) are off in the
browser and on the server. **Instructors** get them all, in the course root.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

# nbgrader's JupyterLab plugins a student of the hub must not have (the Assignment List, the
# Nbgrader menu, which then lists only it, and Validate stay)
STUDENT_HIDDEN_PLUGINS = (
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:course-list",
)
NEWS_PLUGIN = "@jupyterlab/apputils-extension:announcements"
SERVER_EXTENSIONS = {  # nbgrader's server halves: on for whom
    "nbgrader.server_extensions.assignment_list": ("student", "instructor"),
    "nbgrader.server_extensions.validate_assignment": ("student", "instructor"),
    "nbgrader.server_extensions.formgrader": ("instructor",),
    "nbgrader.server_extensions.course_list": ("instructor",),
}
DEFAULT_EXCHANGE = "/usr/local/share/nbgrader/exchange"
# A terminal's shell without ``-l``: a login shell (what jupyter_server starts when its output is not
# a terminal, as under a hub's spawner or make lab) reads /etc/profile, which resets PATH and loses
# the kit's .venv/bin, so `python -m gpulab doctor` would run the machine's python.
TERMINAL = {"shell_command": ["/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"]}  # nbgrader's own default Exchange.root

NBGRADER_CONFIG = '''# written by `make hub` (gpulab/hub/site.py) for every {role}'s server: do not edit, edit the roster
# or the course's nbgrader_config.py and restart the hub
c = get_config()  # noqa: F821 - provided by nbgrader
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
c.Exchange.path_includes_course = False
{extra}
# the course's execution limits: the same cell timeout for Validate as for make grade
from gpulab.autograde.execute.config import configure  # noqa: E402

configure(c)
'''


def course_id(course: str | Path) -> str:
    """The course id of the course's ``nbgrader_config.py`` (``c.CourseDirectory.course_id = "..."``).

    Raises:
        ValueError: no such file, or no course id in it.
    """
    path = Path(course) / "nbgrader_config.py"
    try:
        m = re.search(r"^c\.CourseDirectory\.course_id\s*=\s*['\"]([^'\"]+)['\"]", path.read_text(), re.M)
    except OSError as err:
        raise ValueError(f"{path}: {err.strerror}; COURSE= must be the nbgrader course root (notebooks/)") from None
    if not m:
        raise ValueError(f"{path} sets no c.CourseDirectory.course_id; add one, e.g. c.CourseDirectory.course_id = \"gpulab\"")
    return m.group(1)


def write_role_config(folder: str | Path, role: str, cid: str, exchange: str | Path, course: str | Path) -> Path:
    """One role's Jupyter settings (page config, server extensions, nbgrader) in ``folder``."""
    folder = Path(folder)
    (folder / "labconfig").mkdir(parents=True, exist_ok=True)
    disabled = [NEWS_PLUGIN] + (list(STUDENT_HIDDEN_PLUGINS) if role == "student" else [])
    (folder / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": {p: True for p in disabled}}, indent=1))
    server: dict = {"ServerApp": {"jpserver_extensions": {ext: role in who for ext, who in SERVER_EXTENSIONS.items()},
                                  "terminado_settings": TERMINAL}}  # PATH keeps the kit's .venv/bin
    if role == "instructor":  # the formgrader panel is an iframe of the server's own page
        server["ServerApp"]["tornado_settings"] = {"headers": {"Content-Security-Policy": "frame-ancestors 'self'"}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(server, indent=1))
    extra = f"c.CourseDirectory.root = {str(Path(course).resolve())!r}" if role == "instructor" else ""
    (folder / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(role=role, course_id=cid, exchange=str(exchange),
                                                                      extra=extra))
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return folder


def make_exchange(exchange: str | Path) -> Path:
    """Create nbgrader's exchange root, mode 1777 (nbgrader wants it writable by all; the sticky bit
    keeps anyone but its owner from removing a course folder in it), and make its parents passable."""
    exchange = Path(exchange).absolute()
    check_exchange(exchange)  # before anything is created
    exchange.mkdir(parents=True, exist_ok=True)
    exchange.chmod(0o1777)
    return exchange


def check_exchange(exchange: str | Path) -> None:
    """Raise ``ValueError`` if an existing folder above ``exchange`` is closed to other users."""
    for parent in (p for p in Path(exchange).absolute().parents if p.is_dir()):
        mode = parent.stat().st_mode
        if mode & 0o001 == 0:
            raise ValueError(f"{parent} is not passable by other users (mode {oct(mode & 0o777)}): students could not "
                             "reach the exchange; choose EXCHANGE= elsewhere or chmod o+x it")


def make_state(state: str | Path) -> Path:
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o711)
    return state


def make_database(state: str | Path) -> Path:
    """JupyterHub's database, created empty as root's only (0600) before the hub opens it: the
    users, their activity and the OAuth secrets (JupyterHub would create it with the umask's 0644)."""
    path = Path(state) / "jupyterhub.sqlite"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)
    return path


def write_plan(state: str | Path, plan: dict) -> Path:
    """Write ``plan.json`` (root only) and the ``jupyterhub_config.py`` that applies it."""
    state = Path(state)
    path = state / "plan.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f, indent=1)
    (state / "jupyterhub_config.py").write_text(
        "# written by `make hub` (gpulab/hub/site.py): the settings are in plan.json\n"
        "from gpulab.hub.config import apply\n\n"
        f"apply(c, {str(path)!r})  # noqa: F821 - c is provided by JupyterHub\n")
    return path


def blocked_dirs(paths: list[str | Path]) -> list[Path]:
    """The folders on the way to ``paths`` that other users cannot pass through (no ``o+x``): the
    kit's environment and its Python must be reachable by every student's server."""
    blocked: list[Path] = []
    for path in paths:
        p = Path(path).resolve()
        for d in [*reversed(p.parents), p]:
            if d.is_dir() and not d.stat().st_mode & 0o001 and d not in blocked:
                blocked.append(d)
    return blocked
