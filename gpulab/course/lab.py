"""``make lab``: the student's JupyterLab, or the instructor's, on a free port, with the real URL.

It releases only the labs whose source changed since their release copy, copies into ``work/``
what is not there yet (a student's work is never replaced), picks a free port, makes the token,
prints the URL, and then becomes JupyterLab (``exec``). The student's JupyterLab serves ``work/``
with nbgrader's Validate and nothing of the instructor's tools (off in the browser's
``disabledExtensions`` and on the server); ``--instructor`` serves the course root with all of
them. The settings live in a folder of their own on ``JUPYTER_CONFIG_PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.autograde.execute.config import write_nbgrader_config
from gpulab.autograde.nbgrader import find_labs, nbgrader_env
from gpulab.hub.site import TERMINAL  # the same terminal as on the hub: PATH keeps .venv/bin

# nbgrader's JupyterLab plugins a student must not see (Validate, "@jupyter/nbgrader:validate-assignment", stays)
INSTRUCTOR_PLUGINS = (
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:assignment-list",
    "@jupyter/nbgrader:course-list",
    "@jupyter/nbgrader:menu",
)
# ... and their server halves (the Assignment List's is the one that logs "ExchangeError: Unwritable directory")
INSTRUCTOR_SERVER_EXTENSIONS = (
    "nbgrader.server_extensions.formgrader",
    "nbgrader.server_extensions.assignment_list",
    "nbgrader.server_extensions.course_list",
)
NEWS_PLUGIN = "@jupyterlab/apputils-extension:announcements"  # "Would you like to receive official Jupyter news?"


def stale_labs(course: str | Path) -> list[str]:
    """Labs whose release copy is missing or older than a file of their source, the course's header or
    its nbgrader configuration (a fresh clone releases everything once)."""
    course = Path(course)
    shared = [p for p in (course / "nbgrader_config.py", course / "source" / "header.ipynb") if p.exists()]
    stale = []
    for lab in find_labs(course):
        released = list((course / "release" / lab).glob("*.ipynb"))
        if not released:
            stale.append(lab)
            continue
        written = min(p.stat().st_mtime for p in released)
        sources = [p for p in (course / "source" / lab).rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts]
        if any(p.stat().st_mtime > written for p in sources + shared):
            stale.append(lab)
    return stale


def free_port(start: int, tries: int = 50, host: str = "127.0.0.1") -> int:
    """The first port from ``start`` up that nothing listens on (ValueError outside 1-65535,
    RuntimeError naming the fix when ``tries`` ports are taken)."""
    if not 0 < start < 65536:
        raise ValueError(f"port {start} is not a TCP port; use one between 1024 and 65535, e.g. PORT=8888")
    for port in range(start, min(start + tries, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"ports {start}-{start + tries - 1} are all in use; stop an old `make lab` (Ctrl+C in its "
                       f"terminal) or choose another range: make lab PORT=9000")


def write_config(folder: str | Path, instructor: bool) -> Path:
    """Write one mode's JupyterLab page and server config into ``folder`` (for ``JUPYTER_CONFIG_PATH``)."""
    folder = Path(folder)
    (folder / "labconfig").mkdir(parents=True, exist_ok=True)
    disabled = [NEWS_PLUGIN] + ([] if instructor else list(INSTRUCTOR_PLUGINS))
    (folder / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": {p: True for p in disabled}}, indent=1))
    server = {"ServerApp": {"jpserver_extensions": {ext: instructor for ext in INSTRUCTOR_SERVER_EXTENSIONS},
                            "terminado_settings": TERMINAL}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(server, indent=1))
    write_nbgrader_config(folder)
    return folder


def student_config_dir(instructor: bool = False) -> Path:
    """Where ``make lab`` keeps the settings of one mode (inside the environment, so they go with .venv)."""
    return Path(sys.prefix) / "etc" / "gpulab-lab" / ("instructor" if instructor else "student")


@dataclass
class LabCommand:
    """How to start JupyterLab: the command, its environment and folder, and the URL to open."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    url: str
    port: int
    token: str = field(repr=False, default="")


def lab_command(root: str | Path, port: int, instructor: bool = False, config_dir: str | Path | None = None,
                token: str | None = None) -> LabCommand:
    """The JupyterLab command serving ``root`` on ``port`` (``config_dir``: default
    :func:`student_config_dir`; ``token``: default a new random one)."""
    root = Path(root).resolve()
    config_dir = Path(config_dir) if config_dir else student_config_dir(instructor)
    write_config(config_dir, instructor)
    token = token or secrets.token_hex(24)
    env = nbgrader_env({"JUPYTER_TOKEN": token})  # the token by environment: not visible in `ps`
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(config_dir), *filter(None, [env.get("JUPYTER_CONFIG_PATH")])])
    jupyter = Path(sys.executable).parent / "jupyter"
    argv = [str(jupyter) if jupyter.exists() else "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        argv.append("--allow-root")
    return LabCommand(argv, env, root, f"http://127.0.0.1:{port}/lab?token={token}", port, token)


def prepare(course: str | Path, work: str | Path) -> list[str]:
    """Release the stale labs and copy what is new into ``work``; returns the labs released."""
    from gpulab.course.release import copy_work, release

    stale = stale_labs(course)
    for lab in stale:
        release(course, lab)
    fresh = len(find_labs(course)) - len(stale)
    if fresh:
        print(f"{fresh} lab(s) already released and unchanged: not released again")
    copy_work(course, work)
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.course.lab", description=__doc__.split("\n\n")[0])
    p.add_argument("--course", default="notebooks", help="the nbgrader course root")
    p.add_argument("--work", default="work", help="the student's work folder")
    p.add_argument("--port", type=int, default=8888, help="the first port to try (default 8888)")
    p.add_argument("--instructor", action="store_true", help="serve the course root with nbgrader's instructor tools")
    p.add_argument("--dry-run", action="store_true", help="prepare and print the URL, but do not start JupyterLab")
    args = p.parse_args(argv)
    try:
        port = free_port(args.port)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    prepare(args.course, args.work)
    root = args.course if args.instructor else args.work
    cmd = lab_command(root, port, instructor=args.instructor)
    moved = f" (port {args.port} is taken, so {port})" if port != args.port else ""
    who = "instructor's JupyterLab (nbgrader's tools included)" if args.instructor else "your JupyterLab"
    print(f"\nStarting {who} in {cmd.cwd}{moved}.\nOpen this URL in your browser:\n\n    {cmd.url}\n\n"
          "Stop it with Ctrl+C in this terminal (twice, or once and answer y). Your notebooks stay in "
          f"{cmd.cwd}.\n", flush=True)
    if args.dry_run:
        return 0
    os.chdir(cmd.cwd)
    os.execvpe(cmd.argv[0], cmd.argv, cmd.env)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
