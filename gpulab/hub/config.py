"""JupyterHub's configuration for the course, from the plan ``make hub`` wrote (:mod:`gpulab.hub.site`).

``<state>/jupyterhub_config.py`` calls :func:`apply`. The settings, and why:

- **PAM** with the roster's local accounts only (``allowed_users``); PAM sessions are not opened
  (``open_sessions``: many servers have no ``pam_systemd`` for a hub, and a failing session would
  stop the login).
- **The network**: ``127.0.0.1`` and port 8000 unless told otherwise, a base URL, TLS when a
  certificate and key are given; the hub's internal API and the proxy's API on free loopback ports.
- **The spawner**: :class:`gpulab.hub.spawner.CourseSpawner` (each server as its user, in the kit's
  environment, with its role's settings and its share).
- **Idle culling**: ``jupyterhub-idle-culler`` as a hub service, stopping servers idle for
  ``cull_idle_s`` (a forgotten server does not hold a GPU all night).
- **State** (the hub's database of users and its cookie secret) in the state folder, so a restarted
  hub knows everyone; stopping the hub stops the servers (``cleanup_servers``), never their files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(plan_file: str | Path) -> dict[str, Any]:
    return json.loads(Path(plan_file).read_text())


def apply(c: Any, plan_file: str | Path) -> None:
    """Set JupyterHub's traitlets config ``c`` from the plan."""
    plan = load(plan_file)
    state = Path(plan["state"])
    hub = c.JupyterHub
    hub.ip, hub.port, hub.base_url = plan["ip"], plan["port"], plan["base_url"]
    if plan.get("ssl_cert"):
        hub.ssl_cert, hub.ssl_key = plan["ssl_cert"], plan["ssl_key"]
    hub.hub_ip, hub.hub_port = "127.0.0.1", plan["hub_port"]
    hub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
    hub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    hub.pid_file = str(state / "jupyterhub.pid")
    hub.cleanup_servers = True
    hub.cleanup_proxy = True
    c.ConfigurableHTTPProxy.command = [plan["proxy"]]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{plan['proxy_api_port']}"
    c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")

    hub.authenticator_class = "pam"
    c.PAMAuthenticator.open_sessions = False
    c.Authenticator.allowed_users = {u for u, _ in plan["roster"]}
    c.Authenticator.admin_users = set()  # nobody may reach another user's server, instructors included

    hub.spawner_class = "gpulab.hub.spawner.CourseSpawner"
    c.CourseSpawner.plan_file = str(plan_file)
    c.Spawner.default_url = "/lab"
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 120
    c.Spawner.poll_interval = 10  # a server that died (killed, out of memory) is noticed within 10 s

    if plan.get("cull_idle_s"):
        hub.services = [{"name": "idle-culler",
                         "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                                     f"--timeout={plan['cull_idle_s']}", f"--cull-every={max(30, plan['cull_idle_s'] // 6)}"]}]
        hub.load_roles = [{"name": "idle-culler", "services": ["idle-culler"],
                           "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}]
