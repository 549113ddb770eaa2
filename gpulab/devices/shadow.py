"""A folder named ``gpulab`` that hides the installed package: a clear error instead of a riddle.

Python looks for ``gpulab`` in the script's folder (or the current directory, for ``python -c``, a
notebook or the REPL) before it asks the finder that ``pip install -e .`` puts on ``sys.meta_path``.
A plain folder named ``gpulab`` there (no ``__init__.py``: a *namespace package*) is taken for the
package, and the first name read from it fails far from the cause::

    ImportError: cannot import name 'MaskedReference' from 'gpulab' (unknown location)

None of gpulab's own code runs in that case (the folder has none), so the check cannot live in the
package's ``__init__``: :func:`install` puts :class:`ShadowGuard` first on ``sys.meta_path`` when the
interpreter starts, from a ``.pth`` file in the virtual environment's site-packages that ``make setup``
writes (``python -m gpulab.devices.shadow install``). The guard answers only for the name ``gpulab``: when the
path search would return a namespace package while another finder knows the installed package, it
raises an ``ImportError`` naming the folder, the installed copy and the fix. Otherwise it steps aside.
Standard library only: it runs in every interpreter of the environment, before anything is imported.

    python -m gpulab.devices.shadow install     # write the .pth (make setup does it)
    python -m gpulab.devices.shadow check       # what `import gpulab` would find from this directory
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

PACKAGE = "gpulab"
PTH_NAME = "gpulab-shadow-guard.pth"
# One line, run by site.py at start-up (a .pth line that starts with "import" is executed). It finds
# this file through the installed package's spec, without importing the package, and runs install();
# a checkout without this file is skipped, silently.
PTH_LINE = ("import importlib.util as _u, os as _o, runpy as _r; _s = _u.find_spec('gpulab'); "
            "_p = _s and _s.origin and _o.path.join(_o.path.dirname(_s.origin), 'devices', 'shadow.py'); "
            "_p and _o.path.isfile(_p) and _r.run_path(_p, run_name='gpulab_shadow_guard')\n")


def _installed(finders: list) -> ModuleSpec | None:
    """The spec another meta-path finder (the editable install's) gives ``gpulab``, if any."""
    for finder in finders:
        if finder is PathFinder or isinstance(finder, ShadowGuard) or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(PACKAGE, None)
        except Exception:  # a third-party finder's own trouble is not ours to report
            continue
        if spec is not None and spec.origin:
            return spec
    return None


def shadowing_message(folders: list[str], installed: str) -> str:
    """What the student reads: the folder found first, the package it hides, and how to fix it."""
    where = ", ".join(folders)
    return (f"`import gpulab` found the folder {where}, which is not the gpulab package (it has no __init__.py), "
            f"before the installed gpulab ({installed}). Python looks in the script's folder, or the current "
            f"directory, first. Fix: rename or move that folder, or run your script or notebook from another "
            f"directory.")


class ShadowGuard:
    """A meta-path finder for the name ``gpulab`` only: refuses a namespace package that hides the
    installed one, and steps aside (returns None) in every other case."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname != PACKAGE or path is not None:
            return None
        found = PathFinder.find_spec(PACKAGE)
        if found is None or found.origin is not None or not found.submodule_search_locations:
            return None  # nothing on sys.path, or a real module or package: the usual rules apply
        installed = _installed(sys.meta_path)
        if installed is None:
            return None  # no installed gpulab to hide: a namespace package may be what was meant
        folders = [str(Path(p)) for p in found.submodule_search_locations]
        raise ImportError(shadowing_message(folders, str(Path(installed.origin).parent)), name=PACKAGE)


def install() -> None:
    """Put one :class:`ShadowGuard` first on ``sys.meta_path`` (again is a no-op)."""
    if not any(type(f).__name__ == "ShadowGuard" for f in sys.meta_path):
        sys.meta_path.insert(0, ShadowGuard())


def write_pth(site_packages: str | Path | None = None) -> Path:
    """Write the start-up line into ``site_packages`` (default: this interpreter's purelib)."""
    import sysconfig

    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text(PTH_LINE)
    return target


if __name__ == "gpulab_shadow_guard":  # run by the .pth line at start-up
    install()
elif __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print("wrote", write_pth())
    elif sys.argv[1:] == ["check"]:
        sys.path.insert(0, "")
        spec = PathFinder.find_spec(PACKAGE)
        print("the path search finds:", None if spec is None else (spec.origin or list(spec.submodule_search_locations)))
    else:
        sys.exit("usage: python -m gpulab.devices.shadow install | check")
