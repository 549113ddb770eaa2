"""``python -m gpulab.hub <serve|release|extend|collect|feedback>``: what ``make hub`` and the term's loop
run (docs/instructor.md, "Host the class on one server").

    sudo .venv/bin/python -m gpulab.hub serve --roster roster.csv [--create-users] [--port 8000]
    python -m gpulab.hub release --lab 00_setup [--due "2026-10-01 17:00:00 UTC"] [--force]
    python -m gpulab.hub extend --lab 00_setup --student alice --until "2026-10-03 17:00:00 UTC"
    python -m gpulab.hub collect --lab 00_setup
    python -m gpulab.hub feedback --lab 00_setup

``serve`` checks everything before it changes anything (the roster, the accounts, the shares, the
proxy), then creates the missing accounts if asked, writes the exchange, the settings and the plan,
and runs JupyterHub in the foreground. Ctrl+C stops the hub and every server it started; the
per-student cgroups are removed, and the users' homes, the exchange, the course and its gradebook
stay as they are.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from gpulab.accounts import private, users
from gpulab.hub import limits, loop, roster, shares, site

DEFAULT_STATE = "/var/lib/gpulab-hub"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.hub")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "release", "extend", "collect", "feedback"):
        s = sub.add_parser(name)
        s.add_argument("--course", default="notebooks", help="the nbgrader course root (default notebooks)")
        s.add_argument("--state", default=DEFAULT_STATE, help=f"the hub's own files (default {DEFAULT_STATE})")
        if name != "serve":
            s.add_argument("--lab", required=True, help="e.g. 00_setup")
        if name == "release":
            s.add_argument("--due", default=None, help='due date, e.g. "2026-10-01 17:00:00 UTC" (late penalty: '
                                                      "notebooks/nbgrader_config.py)")
            s.add_argument("--force", action="store_true", help="release even when the due date is already past "
                                                                "(make hub-release FORCE=1)")
        if name == "extend":
            s.add_argument("--student", default="", help="the student's account (the roster's user)")
            s.add_argument("--until", default="", help='their own deadline, e.g. "2026-10-03 17:00:00 UTC"; '
                                                      '"none" removes the extension')
    s = sub.choices["serve"]
    s.add_argument("--roster", required=True, help="CSV of user,role (student or instructor)")
    s.add_argument("--create-users", action="store_true", help="create the roster's missing local accounts")
    s.add_argument("--exchange", default=site.DEFAULT_EXCHANGE, help="nbgrader's exchange folder")
    s.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--base-url", default="/", help="URL prefix, e.g. /gpulab/ behind a reverse proxy")
    s.add_argument("--ssl-cert", default=None, help="TLS certificate (PEM); with --ssl-key")
    s.add_argument("--ssl-key", default=None, help="TLS private key (PEM)")
    s.add_argument("--cull-idle", type=int, default=3600, help="stop servers idle this many seconds (0: never)")
    s.add_argument("--cpus-per-student", type=float, default=None, help="cores per student (default: split evenly)")
    s.add_argument("--mem-per-student", type=int, default=None, help="MiB per student (default: 80%% split evenly)")
    s.add_argument("--gpus", type=int, default=None, help="GPUs to share (default: nvidia-smi -L)")
    s.add_argument("--proxy", default=None, help="configurable-http-proxy (default: the one make hub installed)")
    s.add_argument("--dry-run", action="store_true", help="check everything and print the plan; create nothing")
    return p


def _proxy(args: argparse.Namespace) -> Path:
    path = Path(args.proxy) if args.proxy else Path(sys.prefix) / "lib" / "gpulab-hub" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not path.exists():
        raise ValueError(f"no configurable-http-proxy at {path}: `make hub` installs it with npm (Node.js 18+ needed)")
    return path


def plan_for(args: argparse.Namespace, people: roster.Roster) -> tuple[dict, dict[str, shares.Share]]:
    """Everything checked, nothing changed: the plan and the students' shares.

    Raises:
        ValueError: bad options, naming the fix (a :class:`roster.RosterError` for the roster).
    """
    if bool(args.ssl_cert) != bool(args.ssl_key):
        raise ValueError("TLS needs both SSL_CERT= and SSL_KEY=")
    for f in filter(None, (args.ssl_cert, args.ssl_key)):
        if not Path(f).is_file():
            raise ValueError(f"no such file: {f}")
    if not 0 < args.port < 65536:
        raise ValueError(f"port {args.port} is not a TCP port; use 1024-65535, e.g. HUB_PORT=8000")
    base_url = "/" + args.base_url.strip("/") + "/" if args.base_url.strip("/") else "/"
    gpus, cores, mem = shares.machine()
    gpus = gpus if args.gpus is None else args.gpus
    given = shares.assign([p.user for p in people.students], gpus, cores, mem, args.cpus_per_student, args.mem_per_student)
    course = Path(args.course).resolve()
    site.check_exchange(args.exchange)
    plan = {"ip": args.ip, "port": args.port, "base_url": base_url, "ssl_cert": args.ssl_cert, "ssl_key": args.ssl_key,
            "hub_port": _free_port(), "proxy_api_port": _free_port(), "proxy": str(_proxy(args)),
            "state": str(Path(args.state).resolve()), "venv": sys.prefix, "course": str(course),
            "exchange": str(Path(args.exchange).resolve()), "course_id": site.course_id(course),
            "roster": [[p.user, p.role] for p in people.people],
            "shares": {u: {**s.__dict__, "gpus": list(s.gpus)} for u, s in given.items()},
            "cull_idle_s": args.cull_idle, "machine": {"gpus": gpus, "cores": cores, "memory_mb": mem}}
    return plan, given


def serve(args: argparse.Namespace) -> int:
    try:
        people = roster.read(args.roster)
        accounts = roster.check_accounts(people, args.create_users)
        plan, given = plan_for(args, people)
        if not args.dry_run:
            if os.geteuid() != 0:
                raise ValueError("the hub logs users in with PAM and starts their servers as them: run it as root "
                                 "(sudo make hub ROSTER=...)")
            blocked = site.blocked_dirs([sys.prefix, sys.base_prefix])
            if blocked:
                raise ValueError(f"students' servers run the kit's Python ({sys.base_prefix}, .venv {sys.prefix}), but "
                                 f"other users cannot pass through {', '.join(map(str, blocked))}: install Python "
                                 "where every user can read it (/usr/local, /opt) and rebuild .venv (rm -rf .venv && "
                                 "make setup PYTHON=...), or chmod o+x those folders")
            import jupyterhub  # noqa: F401 - make hub installs it; fail before anything is created
    except (ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    state = Path(plan["state"])
    if args.dry_run:  # checked; nothing is created
        _summary(plan, people, given, limits.detect())
        if accounts.missing:
            print(f"would create {len(accounts.missing)} account(s): {', '.join(accounts.missing)}")
        students = [p.user for p in people.students if p.user not in accounts.missing]
        for why in private.exposed(private.private_paths(plan["course"], state), students):
            print(f"would close: {why}")
        return 0
    if accounts.missing:
        try:
            users.create(accounts.missing, password_file=state / "new-passwords.csv")
        except users.UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"created {len(accounts.missing)} account(s): {', '.join(accounts.missing)}; their passwords are in "
              f"{state / 'new-passwords.csv'} (root only)")
    site.make_state(state)
    site.make_database(state)
    closed = private.close(plan["course"], state, [p.user for p in people.instructors])
    exposed = private.exposed(private.private_paths(plan["course"], state), [p.user for p in people.students])
    if exposed:
        print("error: students could still read or write the course's private part:\n  " + "\n  ".join(exposed),
              file=sys.stderr)
        return 2
    print(f"the course's private part is closed to students ({closed} entries changed): {plan['course']} belongs to "
          f"{private.owner_name(plan['course'])} and the group {private.GROUP}")
    site.make_exchange(plan["exchange"])
    plan["configs"] = {role: str(site.write_role_config(state / "jupyter" / role, role, plan["course_id"],
                                                        plan["exchange"], plan["course"]))
                       for role in roster.ROLES}
    trees = limits.detect()
    plan["limits"] = {"memory": str(trees.memory) if trees.memory else None,
                      "cpu": str(trees.cpu) if trees.cpu else None, "version": trees.version}
    site.write_plan(state, plan)
    _summary(plan, people, given, trees)
    hub = subprocess.Popen([str(Path(sys.prefix) / "bin" / "jupyterhub"), "-f", str(state / "jupyterhub_config.py")],
                           cwd=state)
    # Ctrl+C reaches the hub from the terminal (same process group); this process waits for it,
    # then removes what the servers left behind
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: hub.terminate())
    rc = hub.wait()
    limits.teardown(trees)
    print(f"\nthe hub stopped ({rc}). Kept: the users' homes, the exchange {plan['exchange']}, the course "
          f"{plan['course']} (submissions, gradebook.db), the hub's users in {state}.")
    return 0 if rc in (0, -signal.SIGINT, -signal.SIGTERM, 130) else rc


def _summary(plan: dict, people: roster.Roster, given: dict[str, shares.Share], trees: limits.Trees) -> None:
    scheme = "https" if plan["ssl_cert"] else "http"
    host = "127.0.0.1" if plan["ip"] in ("127.0.0.1", "") else plan["ip"]
    m = plan["machine"]
    print(f"course {plan['course_id']!r} in {plan['course']}; exchange {plan['exchange']}")
    print(f"{len(people.students)} student(s), {len(people.instructors)} instructor(s) "
          f"({', '.join(p.user for p in people.instructors)}); machine: {m['gpus']} GPU(s), {m['cores']} cores, "
          f"{m['memory_mb']} MiB; {trees.describe()}")
    for s in given.values():
        gpu = f"GPU {s.gpus[0]} (shared by {s.students_per_gpu})" if s.gpus else "no GPU"
        print(f"  {s.user:<16} {gpu}, {s.cpus:g} core(s), {s.memory_mb} MiB")
    if plan["cull_idle_s"]:
        print(f"idle servers are stopped after {plan['cull_idle_s']} s")
    print(f"\nOpen {scheme}://{host}:{plan['port']}{plan['base_url']} and log in with your account. Stop the hub with "
          "Ctrl+C.\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "serve":
        return serve(args)
    if args.cmd == "release":
        return loop.release(args.course, args.state, args.lab, args.due, args.force)
    if args.cmd == "extend":
        return loop.extend(args.course, args.state, args.lab, args.student, args.until)
    if args.cmd == "collect":
        return loop.collect(args.course, args.state, args.lab)
    return loop.feedback(args.course, args.state, args.lab)


if __name__ == "__main__":
    sys.exit(main())
