"""The class on one server: ``make hub`` runs JupyterHub with nbgrader's exchange.

    make hub ROSTER=roster.csv [CREATE_USERS=1]      # python -m gpulab.hub serve --roster roster.csv

- :mod:`gpulab.hub.roster`  the roster (``user,role``), checked whole before anything is created;
- the local accounts the roster names and the course's closed files: :mod:`gpulab.accounts` (below the grader too);
- :mod:`gpulab.hub.shares`  which GPU, how many cores and how much memory each student's server gets;
- :mod:`gpulab.hub.limits`  those shares enforced, one cgroup per user;
- :mod:`gpulab.hub.site`    the exchange, the per-role Jupyter settings and the hub's plan, written before it starts;
- :mod:`gpulab.hub.spawner` the single-user servers (JupyterHub's LocalProcessSpawner plus the above);
- :mod:`gpulab.hub.loop`    the term's loop through the exchange: release, collect, feedback.

The package never imports ``gpulab.course`` (the library/tooling split of ``tests/test_layout.py``):
the course tools it needs run as commands (``python -m gpulab.course ...``), and the generated
configuration files import them by name. JupyterHub itself is imported only by the spawner and the
hub's configuration, which run inside JupyterHub; the rest runs without it installed.
"""
