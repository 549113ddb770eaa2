"""A tiny process that kills the ranks' process groups if the caller of ``launch`` dies (internal).

Why it exists: each rank already asks Linux to SIGKILL it when the caller dies
(``PR_SET_PDEATHSIG`` in ``_worker.py``), but that setting is per process and a fork clears it, so
whatever a rank started (``subprocess.Popen(["sleep", "300"])``, a DataLoader worker) would be
re-parented to PID 1 and live on. Each rank leads its own process group, and its children stay
in it unless they ask otherwise; this watchdog holds the list of those groups and kills them all
with SIGKILL when the caller goes, however it goes (``kill -9`` included).

How it notices: it reads its stdin, a pipe whose only writer is the caller (the forked ranks close
their inherited copy first thing). The caller writes ``+<pgid>`` for each rank it starts and ``q``
when the launch is over and cleaned up. End of file without ``q`` means the caller died: no
polling, no race with a caller that dies before the watchdog is ready (the EOF waits for it).

Alternatives considered: making a *subreaper* (``PR_SET_CHILD_SUBREAPER``) collect the orphans
would only re-parent them, not kill them, and would have to be the caller itself (a notebook
kernel that would then reap everything it ever starts); a cgroup, which kills everything even
children that left the process group (``start_new_session=True``), needs a delegated cgroup
that an unprivileged notebook usually lacks. Those escapees are out of reach of this watchdog.

It runs as ``python -I -S _watchdog.py`` (stdlib only, a few ms to start, no torch): it is
exec'd, not forked, so it inherits none of the caller's threads or CUDA state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _serve() -> None:
    """The watchdog's loop: collect process groups until ``q`` (all done) or EOF (caller died)."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # Jupyter's "interrupt" signals the kernel's process group
        signal.signal(sig, signal.SIG_IGN)
    groups: list[int] = []
    for line in sys.stdin.buffer:
        if line.startswith(b"+"):
            groups.append(int(line[1:]))
        elif line.startswith(b"q"):
            return
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:  # the group is already gone
            pass


class Watchdog:
    """The caller's handle on a watchdog process (a no-op where there is no ``killpg``: Windows)."""

    def __init__(self) -> None:
        self.proc = None
        if not hasattr(os, "killpg") or not sys.executable:
            return
        try:
            # start_new_session: signals meant for the caller's terminal or process group miss it
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         start_new_session=True, close_fds=True)
        except OSError:
            self.proc = None

    @property
    def fd(self) -> int | None:
        """The pipe's write end, which forked ranks inherit and must close (None without a watchdog)."""
        return self.proc.stdin.fileno() if self.proc else None

    def watch(self, pgid: int) -> None:
        """Kill process group ``pgid`` if the caller dies from now on."""
        self._send(f"+{pgid}\n")

    def close(self) -> None:
        """The launch is over and its processes are gone: stand down (never kill) and exit."""
        if self.proc is None:
            return
        self._send("q\n")
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _send(self, text: str) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.write(text.encode())
                self.proc.stdin.flush()
            except OSError:  # it died (someone killed it): the ranks still have PDEATHSIG
                pass


if __name__ == "__main__":
    _serve()
