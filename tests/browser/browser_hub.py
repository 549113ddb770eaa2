"""The class on one server, end to end: ``make hub``'s JupyterHub, three students and an instructor
as real local accounts, driven in headless Chromium through nbgrader's exchange.

    make test-hub      # root: installs JupyterHub, configurable-http-proxy, Playwright, Chromium if missing

Not part of ``make test`` (the file name does not match ``test_*.py``). It needs root: it creates
four local accounts (``gpltest-*``, marked in their comment field, and removed at the end, with any
left over by an interrupted run), starts the hub as ``make hub`` does (``python -m gpulab.hub
serve``, PAM logins) on a free loopback port, on a scratch copy of the course owned by the test's
instructor, with an exchange of its own. The tests run in order, each on what the one before left:

1. a roster with duplicate, invalid or system names, or missing accounts, is refused whole: a clear
   error and nothing created;
2. each student logs in, fetches lab 00 from the Assignment List, answers it (fully, half, not
   at all: the source notebook's solutions typed into the solution cells), validates and submits;
   no instructor tool is in their JupyterLab; the doctor in their server reports their share;
3. isolation: each student's files are theirs (home 0700) and unreadable by the others, the
   exchange has nbgrader's permissions (inbound and feedback cannot be listed), and a student's
   token cannot reach another student's server or hub record;
4. the instructor (with the formgrader) collects through the exchange, grades with ``make grade``
   (which leaves every file of the course the instructor's) and releases the kit's feedback; the
   scores are those the answers deserve; after grading, the instructor's formgrader, in Chromium,
   saves a manual grade and a comment, and nbgrader's gradebook holds them;
5. each student fetches feedback: their own page, with their score, and nobody else's;
6. faults: a release whose due date is already past is refused without ``FORCE=1``; a second
   submission replaces the first; a submission after the due date gets the course's late penalty
   (``notebooks/nbgrader_config.py``) and grades.csv says how late it was, but not one within the
   student's extension (``make hub-extend``); a regrade keeps the instructor's manual grade; a
   server killed mid-edit comes back
   with the saved work; a hub stopped with Ctrl+C and started again keeps its users, the
   submissions and the gradebook.

Everything is torn down at the end: the hub and every process of the test's accounts, the accounts
and their homes, the per-student cgroups, the scratch course and the exchange. Screenshots and the
hub's log go to ``test-artifacts/hub/``.
"""

from __future__ import annotations

import csv
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import requests

from gpulab.accounts import users
from gpulab.hub import limits, site

from .common import CHROMIUM, CHROMIUM_ARGS, REPO, assert_validate_passed, clear_dialogs, free_port, solutions, wait

ARTIFACTS = REPO / "test-artifacts" / "hub"
LAB = "00_setup"
MARK = "gpulab make test-hub"  # the comment field of the accounts this test makes
STUDENTS = {"gpltest-full": "all", "gpltest-half": "half", "gpltest-blank": "none"}
INSTRUCTOR = "gpltest-inst"
MANUAL = ("gpltest-full", "threads_speedup_answer", 1.5)  # the manual grade the instructor gives (a written answer)
# what a student must not see (the Assignment List and Validate are theirs)
INSTRUCTOR_TEXTS = ("Formgrader", "Course List", "Create Assignment", "Manage Assignments", "Gradebook")

try:
    from playwright import sync_api
except ImportError as err:  # a missing browser driver must fail the run, not skip it
    raise ImportError("Playwright is not installed: run `make test-hub`, or pip install playwright") from err
pytestmark = pytest.mark.browser


def _as(user: str, *argv: str) -> subprocess.CompletedProcess:
    """Run a command as ``user`` (uid, gid and groups), from a folder everyone may enter."""
    pw = pwd.getpwnam(user)
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *argv],
                          capture_output=True, text=True, cwd="/", check=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- the answers -------------------------------------------------------------------------------

def _answers(how: str) -> dict[str, str]:
    sol = solutions(LAB)
    ids = list(sol)
    keep = ids if how == "all" else ids[: len(ids) // 2] if how == "half" else []
    return {k: sol[k] for k in keep}


def _expected_score(how: str) -> tuple[float, float]:
    """(score, max) a submission deserves: a test cell passes when every exercise it requires
    (``require(globals(), ...)``) is defined by an answered solution cell; a written answer (left
    blank here) counts in the max and scores 0 until the instructor grades it."""
    nb = nbformat.read(str(REPO / "notebooks" / "source" / LAB / f"{LAB}.ipynb"), as_version=4)
    answered = set(_answers(how))
    defined = {name for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") in answered
               for name in re.findall(r"^(?:def|class) (\w+)", c.source, re.M)}
    score = total = 0.0
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade"):
            total += meta.get("points", 0)
        if meta.get("grade") and c.cell_type == "code":
            needs = {n for args in re.findall(r"require\(globals\(\),([^)]*)\)", c.source)
                     for n in re.findall(r"['\"](\w+)['\"]", args)}
            if needs and needs <= defined:
                score += meta.get("points", 0)
    return score, total


# ---- the hub -----------------------------------------------------------------------------------

class Hub:
    """``python -m gpulab.hub serve`` on a scratch course, as ``make hub`` runs it."""

    def __init__(self, root: Path) -> None:
        self.root, self.course, self.state = root, root / "course", root / "state"
        self.exchange, self.roster = root / "exchange", root / "roster.csv"
        self.port, self.log = free_port(), root / "hub.log"
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.trees = limits.detect()

    def args(self) -> list[str]:
        return ["--course", str(self.course), "--state", str(self.state)]

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpulab.hub", "serve", "--roster", str(self.roster), *self.args(),
             "--exchange", str(self.exchange), "--port", str(self.port), "--cull-idle", "3600"],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the hub exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                return requests.get(f"{self.base}/hub/api/", timeout=5).status_code == 200
            except requests.RequestException:
                return False
        wait(up, 120, "the hub to answer /hub/api/", every=0.5)

    def ctrl_c(self, timeout: float = 90) -> int:
        """Stop the hub as Ctrl+C in its terminal does: SIGINT to its whole process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"the hub did not stop within {timeout:g} s of Ctrl+C") from None

    def loop(self, step: str, *extra: str) -> subprocess.CompletedProcess:
        """One command of the term's loop (make hub-release / hub-collect / hub-feedback)."""
        done = subprocess.run([sys.executable, "-m", "gpulab.hub", step, "--lab", LAB, *self.args(), *extra],
                              capture_output=True, text=True, cwd=REPO, check=False, timeout=600)
        assert done.returncode == 0, f"hub {step} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def grade(self) -> dict[str, dict]:
        """``make grade`` of the lab, as for any class (under the shared grading lock)."""
        t0 = time.monotonic()
        done = subprocess.run(["flock", "/tmp/gpulab-grade.lock", "sh", "-c", 'echo "locked at $(date +%s.%N)"; exec "$@"',
                               "sh", "make", "-s", "grade", f"COURSE={self.course}", f"LAB={LAB}", "JOBS=2"],
                              capture_output=True, text=True, cwd=REPO, check=False, timeout=1800)
        assert done.returncode == 0, f"make grade failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        locked = float(re.search(r"locked at ([\d.]+)", done.stdout).group(1))
        waited = locked - (time.time() - (time.monotonic() - t0))
        print(f"make grade: {waited:.0f} s waiting for the grading lock, {time.monotonic() - t0 - waited:.0f} s grading")
        with (self.course / "grades.csv").open() as f:
            return {r["student"]: r for r in csv.DictReader(f) if r["lab"] == LAB}

    def token(self, user: str, password: str) -> str:
        """An API token of ``user``, made through the hub's API after a PAM login."""
        s = requests.Session()
        page = s.get(f"{self.base}/hub/login", timeout=30).text
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
        r = s.post(f"{self.base}/hub/login", data={"username": user, "password": password, "_xsrf": xsrf},
                   allow_redirects=False, timeout=60)
        assert r.status_code == 302, f"PAM login of {user} failed: {r.status_code}"
        r = s.post(f"{self.base}/hub/api/users/{user}/tokens", json={"note": "make test-hub", "expires_in": 3600},
                   headers={"X-XSRFToken": s.cookies.get("_xsrf", path="/hub/")}, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def api(self, path: str, token: str, method: str = "GET", allow_redirects: bool = False, **kw) -> requests.Response:
        return requests.request(method, f"{self.base}{path}", headers={"Authorization": f"token {token}"},
                                timeout=60, allow_redirects=allow_redirects, **kw)


def _leftover_test_accounts() -> list[str]:
    return [p.pw_name for p in pwd.getpwall() if p.pw_gecos.split(",")[0] == MARK]


@pytest.fixture(scope="module")
def hub():
    if os.geteuid() != 0:
        pytest.fail("make test-hub needs root: it creates local accounts and starts their servers (sudo make test-hub)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (make test-hub does), or set CHROMIUM")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    users.remove(_leftover_test_accounts())  # an interrupted earlier run
    root = Path(tempfile.mkdtemp(prefix="gpulab-test-hub-"))
    root.chmod(0o755)
    h = Hub(root)
    # the kit's Python must be reachable by the students' servers; a CI machine's may sit in /root
    opened = [(d, _mode(d)) for d in site.blocked_dirs([sys.prefix, sys.base_prefix])]
    for d, m in opened:
        d.chmod(m | 0o001)
    h.passwords = {u: f"pw-{u}-{os.getpid()}" for u in [*STUDENTS, INSTRUCTOR]}
    try:
        users.create([*STUDENTS, INSTRUCTOR], passwords=h.passwords, comment=MARK)
        (h.course / "source").mkdir(parents=True)
        shutil.copytree(REPO / "notebooks" / "source" / LAB, h.course / "source" / LAB)
        for f in ("header.ipynb",):
            shutil.copy(REPO / "notebooks" / "source" / f, h.course / "source" / f)
        shutil.copy(REPO / "notebooks" / "nbgrader_config.py", h.course)  # root's, git's modes: make hub closes it
        h.roster.write_text("user,role\n" + "".join(f"{u},student\n" for u in STUDENTS) + f"{INSTRUCTOR},instructor\n")
        h.start()
        yield h
    finally:
        if h.proc is not None and h.proc.poll() is None:
            h.ctrl_c()
        if h.log.exists():
            shutil.copy(h.log, ARTIFACTS / "hub.log")
        users.remove([*STUDENTS, INSTRUCTOR])
        limits.teardown(h.trees)
        shutil.rmtree(root, ignore_errors=True)
        for d, m in opened:
            d.chmod(m)
        assert not _leftover_test_accounts(), "the test's accounts were not all removed"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


class Student:
    """One logged-in browser session (a context of its own: its own cookies)."""

    def __init__(self, browser, hub: Hub, user: str) -> None:
        self.hub, self.user = hub, user
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.set_default_timeout(90_000)
        self.page = self.context.new_page()
        self.page.goto(f"{hub.base}/hub/login")
        self.page.fill("#username_input", user)
        self.page.fill("#password_input", hub.passwords[user])
        self.page.click("#login_submit")
        self.page.wait_for_url(re.compile(f".*/user/{re.escape(user)}/lab.*"), timeout=180_000)
        self.menu("Help")  # JupyterLab is up

    def url(self, path: str = "", workspace: str = "w") -> str:
        return f"{self.hub.base}/user/{self.user}/lab/workspaces/{workspace}" + (f"/tree/{path}" if path else "")

    def menu(self, top: str):
        item = self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$"))
        item.wait_for()
        return item

    def menu_texts(self) -> dict[str, str]:
        """The text of every menu of the menu bar, each opened in turn."""
        out = {}
        open_menu = self.page.locator(".lm-Menu.lm-MenuBar-menu")
        self.page.locator(".jp-DirListing-content").wait_for()  # JupyterLab has settled (a menu opened while
        for label in self.page.locator(".lm-MenuBar-itemLabel").all_inner_texts():  # it restores may close)
            item = self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(label)}$"))
            for attempt in range(5):
                try:
                    item.click(timeout=10_000)
                    open_menu.wait_for(timeout=10_000)
                    out[label] = open_menu.inner_text(timeout=5_000)
                    break
                except sync_api.TimeoutError:
                    if attempt == 4:
                        raise
            for attempt in range(6):  # Escape to the menu itself, or a click on its item, closes it
                try:
                    if attempt % 2 == 0:
                        open_menu.press("Escape", timeout=2000)
                    else:
                        item.click(timeout=2000)
                    open_menu.wait_for(state="detached", timeout=2000)
                    break
                except sync_api.TimeoutError:
                    continue
        return out

    def from_menu(self, top: str, entry: str, ready) -> None:
        """Menu ``top`` -> ``entry``, until ``ready`` (a locator) shows: a menu opened while JupyterLab
        still restores its layout can close before the click lands, so the whole step is retried."""
        self.page.locator(".jp-DirListing-content").wait_for()
        for attempt in range(5):
            try:
                self.menu(top).click(timeout=10_000)
                self.page.locator(".lm-Menu-itemLabel", has_text=entry).first.click(timeout=10_000)
                ready.wait_for(timeout=30_000)
                return
            except sync_api.TimeoutError:
                if attempt == 4:
                    raise
                self.page.keyboard.press("Escape")

    def assignments(self):
        """Open nbgrader's Assignment List (menu Nbgrader -> Assignment List) in a fresh workspace."""
        self.page.goto(self.url(workspace=f"assignments-{time.monotonic_ns()}"))
        self.from_menu("Nbgrader", "Assignment List", self.page.locator("#released_assignments_list"))
        return self.page

    def open_notebook(self, path: str) -> None:
        self.page.goto(self.url(path, workspace=f"nb-{time.monotonic_ns()}"))
        panel = self.panel()
        panel.locator(".jp-Cell").first.wait_for()
        idle = panel.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        choose = self.page.locator(".jp-Dialog", has_text="Select Kernel").get_by_role("button", name="Select")

        def ready() -> bool:
            if choose.count() and choose.is_visible():
                choose.click()
            return idle.count() > 0 and idle.is_visible()
        wait(ready, 180, f"the kernel of {path} to start")

    def panel(self):
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")

    def save(self, path: Path, must) -> nbformat.NotebookNode:
        """Ctrl+S, then wait until the file on disk is newer and whole (Validate must not read it
        half-written)."""
        before = path.stat().st_mtime_ns
        time.sleep(0.05)  # a new write gets a later mtime even on a coarse clock
        self.panel().locator(".jp-Notebook").click(position={"x": 5, "y": 5})
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("Control+s")

        def saved():
            try:
                if path.stat().st_mtime_ns == before:
                    return None
                nb = nbformat.read(str(path), as_version=4)
            except Exception:  # half-written: read again
                return None
            return nb if must(nb) else None
        return wait(saved, 60, f"{path} to be saved")

    def type_answers(self, path: Path, answers: dict[str, str]) -> None:
        cells = self.panel().locator(".jp-Notebook .jp-Cell")
        release = nbformat.read(str(path), as_version=4)
        for i, c in enumerate(release.cells):
            gid = c.metadata.get("nbgrader", {}).get("grade_id")
            if gid in answers:
                editor = cells.nth(i).locator(".cm-content")
                editor.scroll_into_view_if_needed()
                editor.click()
                self.page.keyboard.press("Control+a")
                self.page.keyboard.insert_text(answers[gid])

    def close(self) -> None:
        try:  # the last page each account saw: what a failing step left on the screen
            self.page.screenshot(path=str(ARTIFACTS / f"last-{self.user}.png"), full_page=False)
        finally:
            self.context.close()


def _home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


# ---- 1. the roster -----------------------------------------------------------------------------

def test_a_bad_roster_is_refused_whole_and_creates_nothing(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.fail("make test-hub needs root")
    cases = {
        "duplicate": ("user,role\ngpltest-r1,student\nGPLtest-r1,student\ngpltest-ri,instructor\n", "already on line 2"),
        "invalid": ("user,role\ngpltest-r1,student\nbad name,student\ngpltest-ri,teacher\n", "not a valid account name"),
        "existing": ("user,role\ngpltest-r1,student\nroot,student\ngpltest-ri,instructor\n", "existing system account"),
    }
    for name, (text, why) in cases.items():
        roster = tmp_path / f"{name}.csv"
        roster.write_text(text)
        state = tmp_path / f"state-{name}"
        done = subprocess.run([sys.executable, "-m", "gpulab.hub", "serve", "--roster", str(roster), "--create-users",
                               "--state", str(state), "--exchange", str(tmp_path / "x"), "--dry-run"],
                              capture_output=True, text=True, cwd=REPO, check=False)
        assert done.returncode == 2, f"{name}: {done.stdout}{done.stderr}"
        assert why in done.stderr and "nothing was created or changed" in done.stderr, done.stderr
        assert not users.exists("gpltest-r1") and not users.exists("gpltest-ri"), f"{name}: an account was created"
        assert not state.exists() and not (tmp_path / "x").exists(), f"{name}: the hub's folders were created"
    # missing accounts without CREATE_USERS=1: the fix is named, nothing is made
    roster = tmp_path / "missing.csv"
    roster.write_text("gpltest-r1,student\ngpltest-ri,instructor\n")
    done = subprocess.run([sys.executable, "-m", "gpulab.hub", "serve", "--roster", str(roster), "--state",
                           str(tmp_path / "s"), "--dry-run"], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 2 and "CREATE_USERS=1" in done.stderr, done.stderr
    assert not users.exists("gpltest-r1")


# ---- 2. the students' hour ---------------------------------------------------------------------

def test_students_fetch_answer_validate_and_submit(hub: Hub, browser) -> None:
    hub.loop("release")
    for user, how in STUDENTS.items():
        s = Student(browser, hub, user)
        try:
            # no instructor tool anywhere in the menus; the Nbgrader menu holds the Assignment List only
            menus = s.menu_texts()
            shown = {label: [t for t in INSTRUCTOR_TEXTS if t in text] for label, text in menus.items()}
            assert not any(shown.values()), f"{user} sees instructor tools: {shown}"
            assert "Assignment List" in menus.get("Nbgrader", ""), menus
            page = s.assignments()
            released = page.locator("#released_assignments_list")
            released.get_by_text(LAB).wait_for()
            _shot(page, f"1-{how}-assignment-list")
            released.get_by_role("button", name="Fetch").click()
            page.locator("#fetched_assignments_list").get_by_text(LAB).first.wait_for()
            nb_path = _home(user) / LAB / f"{LAB}.ipynb"
            wait(nb_path.exists, 30, f"{nb_path} to be fetched")
            assert nb_path.stat().st_uid == pwd.getpwnam(user).pw_uid, "the fetched notebook is the student's"

            s.open_notebook(f"{LAB}/{LAB}.ipynb")
            answers = _answers(how)
            s.type_answers(nb_path, answers)
            s.save(nb_path, must=lambda nb, a=answers: all(
                {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells}.get(k) == v
                for k, v in a.items()))
            validate = s.panel().locator(".jp-Toolbar").get_by_text("Validate", exact=True)
            validate.click()
            dialog = s.page.locator(".jp-Dialog")
            dialog.wait_for(timeout=300_000)
            wait(lambda: re.search(r"Success|failed|error", dialog.inner_text(), re.I), 60, "Validate's result")
            _shot(s.page, f"2-{how}-validate")
            text = dialog.inner_text()
            if how == "all":  # every test passes; only the written answer, left for later, may be reported
                assert_validate_passed(text, LAB, who=f"{user}'s ")
            else:
                assert "failed" in text.lower(), f"{user}'s Validate said:\n{text[:1500]}"
            dialog.get_by_role("button").last.click()

            page = s.assignments()
            fetched = page.locator("#fetched_assignments_list")
            fetched.get_by_role("button", name="Submit").first.click()
            page.locator("#submitted_assignments_list").get_by_text(re.compile(r"\d{4}-\d\d-\d\d")).first.wait_for()
            _shot(page, f"3-{how}-submitted")
        finally:
            s.close()


def test_the_doctor_in_each_server_reports_its_share(hub: Hub, browser) -> None:
    plan = json.loads((hub.state / "plan.json").read_text())
    for user in STUDENTS:
        share = plan["shares"][user]
        token = hub.token(user, hub.passwords[user])
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("!python -m gpulab doctor")], metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}})
        r = hub.api(f"/user/{user}/api/contents/doctor.ipynb", token, "PUT",
                    json={"type": "notebook", "content": json.loads(nbformat.writes(nb))})
        assert r.status_code in (200, 201), r.text
        s = Student(browser, hub, user)
        try:
            s.open_notebook("doctor.ipynb")
            out = s.panel().locator(".jp-OutputArea-output", has_text="enforced by the OS")
            dialogs = []
            for _ in range(4):  # a run sent while the kernel's connection settles can be lost: send it again
                # a dialog over the page (CI once had one for 90 s) would take the click
                dialogs += clear_dialogs(s.page, f"{user}'s doctor.ipynb")
                s.panel().locator(".jp-Cell .cm-content").first.click()
                s.page.keyboard.press("Control+Enter")
                try:
                    out.first.wait_for(timeout=30_000)
                    break
                except sync_api.TimeoutError:
                    continue
            try:
                out.first.wait_for(timeout=30_000)
            except sync_api.TimeoutError:
                _shot(s.page, f"4-doctor-{user}-failed")
                raise AssertionError(f"{user}'s doctor printed no report in 150 s; dialogs answered: {dialogs}")
            text = s.panel().locator(".jp-OutputArea").first.inner_text()
            if user == next(iter(STUDENTS)):
                _shot(s.page, "4-doctor-share")
        finally:
            s.close()
        gpu = "no GPU" if not share["gpus"] else f"GPU {share['gpus'][0]}"
        assert f"gave {user}: {gpu}, {share['cpus']:g} core(s), {share['memory_mb']} MiB" in text, text
        if hub.trees.memory is not None:
            assert f"memory cap {share['memory_mb']} MiB" in text, text
        if hub.trees.cpu is not None:
            assert f"CPU quota {share['cpus']:g} core(s)" in text, text
        hub.api(f"/user/{user}/api/contents/doctor.ipynb", token, "DELETE")


# ---- 3. isolation ------------------------------------------------------------------------------

def test_students_cannot_reach_each_other(hub: Hub) -> None:
    names = list(STUDENTS)
    inbound, outbound = hub.exchange / "gpulab" / "inbound", hub.exchange / "gpulab" / "outbound"
    assert _mode(hub.exchange) & 0o777 == 0o777 and hub.exchange.stat().st_mode & stat.S_ISVTX, \
        f"exchange root {oct(_mode(hub.exchange))}: nbgrader's 777, with the sticky bit"
    assert _mode(inbound) == 0o2733 and _mode(outbound) == 0o755, (oct(_mode(inbound)), oct(_mode(outbound)))
    assert inbound.stat().st_uid == pwd.getpwnam(INSTRUCTOR).pw_uid
    submissions = sorted(p.name for p in inbound.iterdir())
    assert sorted(n.split("+")[0] for n in submissions) == sorted(names), submissions
    tokens = {u: hub.token(u, hub.passwords[u]) for u in names}
    for me in names:
        home = _home(me)
        assert _mode(home) == 0o700 and home.stat().st_uid == pwd.getpwnam(me).pw_uid, f"{home}: {oct(_mode(home))}"
        for other in (u for u in names if u != me):
            nb = _home(other) / LAB / f"{LAB}.ipynb"
            got = _as(me, "cat", str(nb))
            assert got.returncode != 0 and "Permission denied" in got.stderr, f"{me} read {nb}"
            assert _as(me, "ls", str(inbound)).returncode != 0, f"{me} listed the exchange's inbound"
            # by the hub: another student's server, contents and hub record
            for path in (f"/user/{other}/api/contents/{LAB}/{LAB}.ipynb", f"/user/{other}/api/contents/",
                         f"/hub/api/users/{other}"):
                r = hub.api(path, tokens[me], allow_redirects=True)
                assert r.status_code in (403, 404), f"{me} -> {path}: {r.status_code}"
                assert '"cells"' not in r.text and '"content"' not in r.text
        # and their own server answers them, without any instructor tool
        r = hub.api(f"/user/{me}/api/contents/{LAB}/{LAB}.ipynb", tokens[me])
        assert r.status_code == 200 and r.json()["content"]["cells"], r.status_code
        for tool in ("formgrader", "formgrader/gradebook", "formgraders"):
            r = hub.api(f"/user/{me}/{tool}", tokens[me])
            assert r.status_code == 404, f"{me} reached /{tool}: {r.status_code}"


# ---- 4. the instructor -------------------------------------------------------------------------

def test_the_instructor_collects_grades_and_releases_feedback(hub: Hub, browser) -> None:
    s = Student(browser, hub, INSTRUCTOR)
    try:
        menus = s.menu_texts()
        assert "Formgrader" in menus.get("Nbgrader", ""), menus
        s.from_menu("Nbgrader", "Formgrader", s.page.locator("iframe").first)
        frame = s.page.frame_locator("iframe").first
        frame.get_by_text("Manage Assignments").first.wait_for(timeout=120_000)
        frame.locator("#main-table").get_by_text(LAB).first.wait_for(timeout=60_000)  # the released lab, listed
        _shot(s.page, "5-instructor-formgrader")
    finally:
        s.close()
    hub.loop("collect")
    for u in STUDENTS:
        assert (hub.course / "submitted" / u / LAB / f"{LAB}.ipynb").exists(), f"{u}'s submission was not collected"
    grades = hub.grade()
    for u, how in STUDENTS.items():
        score, total = _expected_score(how)
        assert float(grades[u]["score"]) == score and float(grades[u]["max_score"]) == total, (u, grades[u])
    assert _expected_score("all")[0] > _expected_score("half")[0] > _expected_score("none")[0] == 0
    inst = pwd.getpwnam(INSTRUCTOR).pw_uid  # make grade ran as root: nothing of it may be left root's
    others = [p for p in [hub.course, *hub.course.rglob("*")] if p.lstat().st_uid != inst]
    assert not others, f"make grade left files the instructor's formgrader cannot write: {others[:5]}"
    hub.loop("feedback")
    fb = hub.exchange / "gpulab" / "feedback"
    assert _mode(fb) == 0o711, f"feedback folder {oct(_mode(fb))}: nobody may list it"
    assert len(list(fb.glob("*.html"))) == len(STUDENTS)
    for f in fb.glob("*.html"):
        assert "BEGIN HIDDEN TESTS" not in f.read_text()


# ---- 5. feedback -------------------------------------------------------------------------------

def test_each_student_fetches_their_own_feedback_only(hub: Hub, browser) -> None:
    grades = {r["student"]: r for r in csv.DictReader((hub.course / "grades.csv").open())}
    fb = hub.exchange / "gpulab" / "feedback"
    for user, how in STUDENTS.items():
        s = Student(browser, hub, user)
        try:
            page = s.assignments()
            submitted = page.locator("#submitted_assignments_list")
            submitted.get_by_role("button", name="Fetch Feedback").first.click()
            submitted.get_by_text("view feedback").first.wait_for()
            _shot(page, f"6-{how}-feedback-fetched")
        finally:
            s.close()
        pages = list((_home(user) / LAB / "feedback").rglob("*.html"))
        assert len(pages) == 1, f"{user} got {pages}"
        assert pages[0].stat().st_uid == pwd.getpwnam(user).pw_uid
        html = pages[0].read_text()
        score, total = float(grades[user]["score"]), float(grades[user]["max_score"])
        first = re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)", html)  # the notebook's total, above the cells'
        assert first and (float(first.group(1)), float(first.group(2))) == (score, total), \
            f"{user}'s page shows {first and first.group(0)}, not their {score:g} / {total:g}"
        assert _as(user, "ls", str(fb)).returncode != 0, f"{user} listed the exchange's feedback folder"
        for other in (u for u in STUDENTS if u != user):
            got = _as(user, "find", str(_home(other) / LAB / "feedback"))
            assert got.returncode != 0, f"{user} reached {other}'s feedback"


def test_a_students_account_reads_and_writes_nothing_private(hub: Hub) -> None:
    """As each student's own account (uid, gid, groups: what their terminal runs as), after collect,
    grade and feedback: every private file is out of reach, each attempt a named assertion; the
    course stays the instructor's (none of it root's, none of it open to others)."""
    course = hub.course
    for me in STUDENTS:
        other = next(u for u in STUDENTS if u != me)
        reads = {
            "the course's source notebook (solutions, hidden tests)": course / "source" / LAB / f"{LAB}.ipynb",
            "the kit's source notebook": REPO / "notebooks" / "source" / LAB / f"{LAB}.ipynb",
            "the kit's tests (second designs)": REPO / "tests" / "conftest.py",
            "gradebook.db": course / "gradebook.db",
            "grades.csv": course / "grades.csv",
            "a classmate's submission": course / "submitted" / other / LAB / f"{LAB}.ipynb",
            "a classmate's submission secret": course / "submitted" / other / LAB / "submission_secret.txt",
            "a classmate's autograded notebook": course / "autograded" / other / LAB / f"{LAB}.ipynb",
            "a classmate's feedback page in the course": course / "feedback" / other / LAB / f"{LAB}.html",
            "the grading logs": course / "grading_logs",
            "the hub's database": hub.state / "jupyterhub.sqlite",
        }
        if (REPO / ".git" / "HEAD").exists():
            reads["the kit's git history"] = REPO / ".git" / "HEAD"
        for what, path in reads.items():
            assert path.exists(), f"{path} is missing: reading it proves nothing"
            got = _as(me, "cat", str(path)) if path.is_file() else _as(me, "ls", str(path))
            assert got.returncode != 0, f"{me} read {what}: {path}"
        sub = course / "submitted" / other / LAB
        writes = {"created a file in": ["touch", str(sub / "planted.txt")],
                  "renamed a file in": ["mv", str(sub / "timestamp.txt"), str(sub / "renamed.txt")]}
        for what, argv in writes.items():
            assert _as(me, *argv).returncode != 0, f"{me} {what} {other}'s submission"
        assert (sub / "timestamp.txt").exists() and not (sub / "planted.txt").exists()
    inst = pwd.getpwnam(INSTRUCTOR)
    for p in [course, *course.rglob("*")]:
        st = p.lstat()
        assert st.st_uid == inst.pw_uid, f"{p} belongs to {pwd.getpwuid(st.st_uid).pw_name}, not the instructor"
        assert not st.st_mode & 0o007 or p.is_symlink(), f"{p} is open to others: {oct(_mode(p))}"
    assert _as(INSTRUCTOR, "test", "-w", str(course / "gradebook.db")).returncode == 0, "the formgrader cannot write"


def test_the_instructors_formgrader_saves_a_manual_grade_after_grading(hub: Hub, browser) -> None:
    """After make grade (as root) and the feedback: the instructor, in Chromium, opens the
    formgrader's manual grading of lab 00, opens a graded submission, types a score and a comment
    on its written answer; nbgrader's gradebook (read with its own API) holds both."""
    from nbgrader.api import Gradebook

    student, cell, points = MANUAL
    comment = "Clear reasoning about the threads (make test-hub)"
    db = f"sqlite:///{hub.course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        nb_id = gb.find_submission_notebook(LAB, LAB, student).id
        before = float(gb.find_submission(LAB, student).score)
        grade = gb.find_grade(cell, LAB, LAB, student)
        # nobody graded it yet: no manual score, and no points (nbgrader's autograde scores an answer left
        # as released 0, one that was written None, so both wait for the instructor)
        assert grade.manual_score is None and not grade.auto_score, ("a written answer nobody graded yet",
                                                                     grade.manual_score, grade.auto_score)
    s = Student(browser, hub, INSTRUCTOR)
    try:
        page = s.page
        page.goto(f"{hub.base}/user/{INSTRUCTOR}/formgrader/gradebook/{LAB}/{LAB}")
        link = page.locator(f"a.name-hidden[href$='/formgrader/submissions/{nb_id}']")
        link.wait_for(timeout=60_000)
        _shot(page, "7-instructor-manual-grading")
        link.click()
        page.wait_for_url(re.compile(f".*/formgrader/submissions/{nb_id}.*"))
        score, text = page.locator(f"input.score#{cell}"), page.locator(f"textarea.comment#{cell}-comment")
        page.locator(f"input#{cell}_extra_credit[placeholder]").wait_for()  # the grade's view is bound
        text.wait_for()
        page.locator(f"textarea#{cell}-comment[placeholder]").wait_for()  # and the comment's
        score.fill(f"{points:g}")
        score.press("Tab")  # a change event: the formgrader saves it
        text.fill(comment)
        text.press("Tab")

        def saved() -> bool:
            with Gradebook(db) as gb:
                g, c = gb.find_grade(cell, LAB, LAB, student), gb.find_comment(cell, LAB, LAB, student)
                return g.manual_score == points and c.manual_comment == comment
        wait(saved, 60, "the formgrader's manual grade and comment to reach gradebook.db")
        _shot(page, "7-instructor-manual-grade-saved")
        page.reload()  # and the formgrader shows them again, read back from the gradebook
        page.locator(f"input#{cell}_extra_credit[placeholder]").wait_for()
        assert float(score.input_value()) == points and text.input_value() == comment
    finally:
        s.close()
    with Gradebook(db) as gb:
        assert float(gb.find_submission(LAB, student).score) == before + points, "the manual grade counts"
    db_file = hub.course / "gradebook.db"
    assert db_file.stat().st_uid == pwd.getpwnam(INSTRUCTOR).pw_uid and not _mode(db_file) & 0o007


# ---- 6. faults ---------------------------------------------------------------------------------

def _resubmit(hub: Hub, browser, user: str, how: str, shot: str) -> None:
    s = Student(browser, hub, user)
    try:
        nb_path = _home(user) / LAB / f"{LAB}.ipynb"
        s.open_notebook(f"{LAB}/{LAB}.ipynb")
        answers = _answers(how)
        s.type_answers(nb_path, answers)
        s.save(nb_path, must=lambda nb: all(
            {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells}.get(k) == v
            for k, v in answers.items()))
        page = s.assignments()
        before = page.locator("#submitted_assignments_list").get_by_text(re.compile(r"\d{4}-\d\d-\d\d")).count()
        page.locator("#fetched_assignments_list").get_by_role("button", name="Submit").first.click()
        wait(lambda: page.locator("#submitted_assignments_list").get_by_text(
            re.compile(r"\d{4}-\d\d-\d\d")).count() > before, 60, f"{user}'s second submission to be listed")
        _shot(page, shot)
    finally:
        s.close()


def test_a_later_submission_counts_and_a_late_one_is_penalised(hub: Hub, browser) -> None:
    from nbgrader.api import Gradebook

    from gpulab.autograde.gradebook import late_note

    due = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    time.sleep(1.5)  # the due date is past before either resubmission
    # make hub-release DUE=<past>, off a terminal: refused, naming FORCE=1, and nothing changed
    refused = subprocess.run([sys.executable, "-m", "gpulab.hub", "release", "--lab", LAB, *hub.args(), "--due", due],
                             capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, check=False)
    assert refused.returncode == 2 and "is already past" in refused.stderr and "FORCE=1" in refused.stderr, \
        refused.stderr
    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
        assert gb.find_assignment(LAB).duedate is None, "the refused release set a due date"
    hub.loop("release", "--due", due, "--force")  # make hub-release DUE=... FORCE=1: the due date in the gradebook
    # the blank student has until tomorrow (make hub-extend), and submits again, fully answered
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() + 86400))
    assert "may submit 00_setup until" in hub.loop("extend", "--student", "gpltest-blank", "--until", until).stdout
    _resubmit(hub, browser, "gpltest-blank", "all", "8-blank-resubmitted-extended")
    # the half student submits again, fully answered, after the due date: the course's late penalty
    _resubmit(hub, browser, "gpltest-half", "all", "9-half-resubmitted-late")
    hub.loop("collect")
    grades = hub.grade()
    full, total = _expected_score("all")
    manual_student, _, manual = MANUAL
    assert manual_student == "gpltest-full"
    assert float(grades["gpltest-full"]["score"]) == full + manual, ("the regrade keeps the manual grade",
                                                                     grades["gpltest-full"])
    assert 'penalty_method = "zero"' in (hub.course / "nbgrader_config.py").read_text(), \
        "the course's late penalty is set in notebooks/nbgrader_config.py"
    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
        late = gb.find_submission(LAB, "gpltest-half")
        extended = gb.find_submission(LAB, "gpltest-blank")
        # the late one scores what its answers earn, and the course's penalty takes all of it
        assert late.score == full and late.late_submission_penalty == full, (late.score, late.late_submission_penalty)
        assert late.total_seconds_late > 0
        # the extended one was submitted after the due date, before the student's own
        assert extended.timestamp > gb.find_assignment(LAB).duedate and extended.total_seconds_late == 0
        assert extended.score == full and not extended.late_submission_penalty
        note = late_note(late.total_seconds_late, full, full)
    # grades.csv shows what counts: the score less the penalty, and says by how much it was late
    assert float(grades["gpltest-half"]["score"]) == 0 and note in grades["gpltest-half"]["notes"], grades["gpltest-half"]
    assert re.match(r"late by (under 0\.1|\d+\.\d) h, \d+ points off", note), note
    for on_time in ("gpltest-blank", "gpltest-full"):
        assert "late by" not in grades[on_time]["notes"], grades[on_time]
    assert float(grades["gpltest-blank"]["score"]) == full, grades["gpltest-blank"]


def test_a_server_killed_mid_edit_keeps_the_saved_work(hub: Hub) -> None:
    user = "gpltest-full"
    token = hub.token(user, hub.passwords[user])
    r = hub.api(f"/user/{user}/api/contents/notes.txt", token, "PUT",
                json={"type": "file", "format": "text", "content": "saved before the crash\n"})
    assert r.status_code in (200, 201), r.text
    server = subprocess.run(["pgrep", "-u", user, "-f", "jupyterhub-singleuser"], capture_output=True, text=True)
    pids = [int(p) for p in server.stdout.split()]
    assert pids, "the student's server is running"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait(lambda: hub.api(f"/hub/api/users/{user}", token).json().get("server") is None, 120,
          "the hub to notice the dead server", every=1)
    r = hub.api(f"/hub/api/users/{user}/server", token, "POST")
    assert r.status_code in (201, 202), r.text
    wait(lambda: hub.api(f"/user/{user}/api/status", token).status_code == 200, 120, "the server to start again")
    r = hub.api(f"/user/{user}/api/contents/notes.txt", token)
    assert r.status_code == 200 and r.json()["content"] == "saved before the crash\n"
    assert (_home(user) / LAB / f"{LAB}.ipynb").exists()


def test_a_restarted_hub_keeps_users_submissions_and_gradebook(hub: Hub) -> None:
    token = hub.token(INSTRUCTOR, hub.passwords[INSTRUCTOR])
    submitted = sorted(p.name for p in (hub.exchange / "gpulab" / "inbound").iterdir())
    gradebook = (hub.course / "gradebook.db").read_bytes()
    rc = hub.ctrl_c()
    assert rc == 0, f"Ctrl+C: the hub exited with {rc}:\n{hub.log.read_text()[-2000:]}"
    def left() -> dict[str, list[str]]:  # killed processes linger until PID 1 reaps them: wait for that
        return {u: p for u in [*STUDENTS, INSTRUCTOR]
                if (p := subprocess.run(["pgrep", "-a", "-u", u], capture_output=True, text=True).stdout.splitlines())}
    try:
        wait(lambda: not left(), 30, "the accounts' processes to be gone after Ctrl+C", every=0.5)
    except AssertionError:
        raise AssertionError(f"processes left after Ctrl+C: {left()}") from None
    assert not limits.members(hub.trees), "processes left in the students' cgroups"
    assert not any((r / limits.TOP).exists() for r in hub.trees.roots()), "the students' cgroups were not removed"
    hub.start()
    # the hub's database (the token made before the restart works), the exchange, the gradebook
    r = hub.api(f"/hub/api/users/{INSTRUCTOR}", token)
    assert r.status_code == 200 and r.json()["name"] == INSTRUCTOR
    assert sorted(p.name for p in (hub.exchange / "gpulab" / "inbound").iterdir()) == submitted
    assert (hub.course / "gradebook.db").read_bytes() == gradebook
    for u in STUDENTS:
        assert hub.token(u, hub.passwords[u])  # every student can still log in
