"""Each user's single-user server: JupyterHub's ``LocalProcessSpawner`` (the server runs as the
user's own account) with the course's additions, all read from the plan (:mod:`gpulab.hub.site`):

- the **kit's environment**: ``jupyterhub-singleuser`` of the kit's ``.venv``, whose ``bin`` is
  first on ``PATH`` (nbgrader runs ``alembic`` and ``jupyter`` from there);
- the **role's settings** (``JUPYTER_CONFIG_PATH``): a student's server serves their home and shows
  the Assignment List and Validate; an instructor's serves the course root with every nbgrader tool;
- the **share** of a student (:mod:`gpulab.hub.shares`): ``CUDA_VISIBLE_DEVICES``, ``GPULAB_SHARE``
  (what ``python -m gpulab doctor`` reports), and the caps of :mod:`gpulab.hub.limits`, joined in
  ``preexec_fn`` before the process becomes the student;
- when the server stops, whatever it left in its cgroup (a kernel that ignored the signal) is killed.
"""

from __future__ import annotations

import os
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Unicode

from gpulab.hub import limits
from gpulab.hub.config import load
from gpulab.hub.shares import Share


class CourseSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` with the course's environment, role settings and per-student share."""

    plan_file = Unicode("", config=True, help="the plan make hub wrote (gpulab/hub/site.py)")

    def _plan(self) -> dict:
        if not hasattr(self, "_plan_cache"):
            self._plan_cache = load(self.plan_file)
        return self._plan_cache

    def _role(self) -> str:
        return dict(self._plan()["roster"]).get(self.user.name, "student")

    def _share(self) -> Share | None:
        raw = self._plan()["shares"].get(self.user.name)
        return Share(**{**raw, "gpus": tuple(raw["gpus"])}) if raw else None

    def _trees(self) -> limits.Trees:
        t = self._plan().get("limits") or {}
        return limits.Trees(*(Path(t[k]) if t.get(k) else None for k in ("memory", "cpu")), t.get("version", 0))

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        plan = self._plan()
        env["PATH"] = os.pathsep.join([str(Path(plan["venv"]) / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
        env["JUPYTER_CONFIG_PATH"] = plan["configs"][self._role()]
        env.pop("VIRTUAL_ENV", None)
        share = self._share()
        if share is not None:
            env.update(share.env())
        return env

    def make_preexec_fn(self, name: str):
        become_user = super().make_preexec_fn(name)
        procs = list(getattr(self, "_procs", []))

        def preexec() -> None:  # in the child, still root: join the caps, then become the user
            limits.join(procs)
            become_user()
        return preexec

    async def start(self):
        plan = self._plan()
        self.cmd = [str(Path(plan["venv"]) / "bin" / "jupyterhub-singleuser")]
        self.notebook_dir = plan["course"] if self._role() == "instructor" else "~"
        share, trees = self._share(), self._trees()
        self._procs = limits.prepare(trees, self.user.name, share.cpus, share.memory_mb) if share and trees.roots() else []
        return await super().start()

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        trees = self._trees()
        if trees.roots():
            limits.kill(trees, self.user.name)
