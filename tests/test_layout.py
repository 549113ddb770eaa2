"""The package layout of issue 14: no import cycles, the library never imports the graders or the
course tooling, few loose top-level modules, and every import path a lab notebook uses resolves.

The import graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` statement, at module level or inside a function (a lazy import still closes a
cycle), and every ``importlib.import_module("gpulab....")`` with a literal name, resolved to the
gpulab module it names. A name computed at run time is not seen: ``gpulab.cli`` looks its
commands up in a table, so the command line may start ``gpulab.course``.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
from conftest import COURSE, REPO

PACKAGE = REPO / "gpulab"
GRADERS = ("gpulab.grading", "gpulab.evidence", "gpulab.verdict", "gpulab.autograde", "gpulab.course", "gpulab.confine")
MAX_LOOSE_MODULES = 4


def _module_names() -> dict[str, Path]:
    """``{"gpulab.devices.doctor": path, "gpulab.devices": path/__init__.py, ...}``."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module that defines ``name`` ("gpulab.parallel.comm.scatter" -> "gpulab.parallel.comm")."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name the module's import statements mention, relative imports made absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # "from . import x" in package a.b is "a.b.x"; each extra dot goes one up
                base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # "from gpulab.parallel import comm" imports the module gpulab.parallel.comm
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)  # importlib.import_module("gpulab.grading.lab06"): an import all the same
    return found


def import_graph() -> dict[str, set[str]]:
    """``{module: the gpulab modules it imports}``.

    Left out: a module's own ancestors (a submodule always runs its packages' ``__init__`` first, so
    ``gpulab.devices.doctor`` -> ``gpulab.devices`` is no dependency of its own), which also covers
    the root package ``gpulab``.
    """
    modules = _module_names()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            if name == "gpulab" or name.startswith("gpulab."):
                target = _owner(name, modules)
                if target and target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (each sorted)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    cycles, placed = [], set()
    for m in sorted(graph):
        if m in placed or m not in reach[m]:
            continue
        group = sorted(n for n in reach[m] if m in reach[n])
        placed.update(group)
        cycles.append(group)
    return cycles


def test_the_cycle_finder_sees_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["e"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_are_resolved(tmp_path: Path) -> None:
    pkg = tmp_path / "inner"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import mod\n")
    (pkg / "mod.py").write_text("def f():\n    from ..other import thing\n    import gpulab.x.y\n"
                                "    return importlib.import_module('gpulab.z'), import_module(name)\n")
    assert _imported_names("gpulab.inner", pkg / "__init__.py") == {"gpulab.inner", "gpulab.inner.mod"}
    assert _imported_names("gpulab.inner.mod", pkg / "mod.py") == {"gpulab.other", "gpulab.other.thing", "gpulab.x.y",
                                                                   "gpulab.z"}


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50 and graph["gpulab.parallel.comm"], "the graph was not read"
    cycles = import_cycles(graph)
    assert cycles == [], "modules that import each other (lazy imports count): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_no_import_cycles_between_packages() -> None:
    """gpulab.grading imports gpulab.parallel; nothing in gpulab.parallel may lead back (the old
    aliases did, through importlib), nor between any two of gpulab's top-level packages."""
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        top = ".".join(module.split(".")[:2])
        packages.setdefault(top, set()).update(t for t in {".".join(t.split(".")[:2]) for t in targets} if t != top)
    cycles = import_cycles(packages)
    assert cycles == [], "packages that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_library_never_imports_the_graders_or_the_course_tools() -> None:
    bad = sorted(f"{m} imports {t}" for m, ts in import_graph().items()
                 if not m.startswith(GRADERS) for t in ts if t.startswith(GRADERS))
    assert bad == [], "library code must not depend on gpulab.grading / gpulab.course / gpulab.confine: " + "; ".join(bad)


def _imports_of(package: str) -> dict[str, set[str]]:
    return {m: ts for m, ts in import_graph().items() if m == package or m.startswith(package + ".")}


def _top(name: str) -> str:
    return ".".join(name.split(".")[:2])


def test_the_grader_is_cut_along_its_stages() -> None:
    """Issue 49's direction: the kernel's side (grading) reaches only the wire (evidence) and the
    verdicts among the grader's packages; the verdicts are pure; the autograder never imports the
    course's make targets; the wire imports no other grader package."""
    bad = []
    for m, ts in _imports_of("gpulab.grading").items():
        bad += [f"{m} imports {t}" for t in ts if t.startswith(GRADERS) and _top(t) not in
                ("gpulab.grading", "gpulab.evidence", "gpulab.verdict")]
    for m, ts in _imports_of("gpulab.evidence").items():
        bad += [f"{m} imports {t}" for t in ts if t.startswith(GRADERS) and _top(t) != "gpulab.evidence"]
    for m, ts in _imports_of("gpulab.verdict").items():
        bad += [f"{m} imports {t}" for t in ts if t.startswith(GRADERS) and _top(t) not in ("gpulab.verdict", "gpulab.evidence")]
    for m, ts in _imports_of("gpulab.autograde").items():
        bad += [f"{m} imports {t}" for t in ts if _top(t) == "gpulab.course"]
    assert bad == [], "; ".join(bad)


def test_the_verdicts_do_no_io() -> None:
    """gpulab.verdict is pure: no files, processes, sockets or clocks (it judges data the grader holds)."""
    io = {"os", "subprocess", "socket", "shutil", "pathlib", "time", "threading", "multiprocessing", "psutil", "sqlite3",
          "torch", "nbformat", "nbclient", "jupyter_client"}
    bad = []
    for path in sorted((PACKAGE / "verdict").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in io]
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
                bad.append(f"{path.name} opens a file")
    assert bad == [], "; ".join(bad)


def test_no_grading_side_file_is_over_300_lines() -> None:
    """gpulab.confine, the OS layers, is left as it was (issue 49: "unchanged")."""
    long = {str(p.relative_to(REPO)): n for pkg in ("autograde", "evidence", "verdict", "course", "grading")
            for p in (PACKAGE / pkg).rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}, long


def test_few_loose_modules_at_the_top_level() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_MODULES, f"{len(loose)} loose modules in gpulab/: {loose}; move some into a package"


# --- the import paths notebooks use ------------------------------------------------------------


def _notebook_imports() -> list[tuple[str, str, str | None]]:
    """``(notebook, module, name or None)`` for every gpulab import in the source notebooks' code cells
    (hidden tests included)."""
    found = []
    for nb_path in sorted((COURSE / "source").glob("*/*.ipynb")):
        nb = nbformat.read(str(nb_path), as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            code = re.sub(r"^\s*[%!].*$", "", cell.source, flags=re.M)  # IPython magics are not Python
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.Import):
                    found += [(nb_path.name, a.name, None) for a in node.names if a.name.startswith("gpulab")]
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpulab"):
                    found += [(nb_path.name, node.module, a.name) for a in node.names]
    return found


def test_every_gpulab_import_in_the_lab_notebooks_resolves() -> None:
    imports = _notebook_imports()
    assert len({nb for nb, _, _ in imports}) >= 5, "the notebooks were not read"
    broken = []
    for nb, module, name in imports:
        try:
            mod = importlib.import_module(module)
            if name is not None and not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")  # "from package import submodule"
        except ImportError as err:
            broken.append(f"{nb}: {'import ' + module if name is None else f'from {module} import {name}'} ({err})")
    assert broken == [], "\n".join(broken)


def test_the_lab_notebooks_import_no_private_name() -> None:
    private = sorted({f"{nb}: {module}{'' if name is None else ' import ' + name}"
                      for nb, module, name in _notebook_imports()
                      if any(part.startswith("_") for part in module.split(".")) or (name or "").startswith("_")})
    assert private == [], "use a public name (REFERENCES, the package's __all__): " + "; ".join(private)


def _gpu_marked(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr in ("gpu", "multigpu") for d in fn.decorator_list)


def _local_functions_launched(tree: ast.AST) -> list[str]:
    """GPU-marked tests that pass ``launch(...)`` a function defined inside them (or a lambda)."""
    found = []
    for outer in ast.walk(tree):
        if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _gpu_marked(outer):
            continue
        local = {n.name for n in ast.walk(outer) if isinstance(n, (ast.FunctionDef, ast.Lambda)) and n is not outer
                 and isinstance(n, ast.FunctionDef)}
        for call in ast.walk(outer):
            if (isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", None)) == "launch"
                    and call.args and (isinstance(call.args[0], ast.Lambda)
                                       or isinstance(call.args[0], ast.Name) and call.args[0].id in local)):
                found.append(f"{outer.name}:{call.lineno}")
    return found


def test_the_local_function_check_sees_a_closure_and_a_lambda() -> None:
    tree = ast.parse("@pytest.mark.multigpu\ndef test():\n    def w(r, n):\n        return r\n    launch(w, 2)\n"
                     "    launch(lambda r, n: r, 2)\n    launch(module_level, 2)\n"
                     "def test_cpu():  # fork carries closures: CPU tests may launch them\n    def w(r, n):\n        return r\n"
                     "    launch(w, 2)\n")
    assert _local_functions_launched(tree) == ["test:5", "test:6"]


def test_every_function_a_test_launches_can_be_spawned() -> None:
    """launch() spawns its ranks once CUDA is initialised (any earlier GPU test does that), and spawn
    imports the function by name: a closure or lambda then fails, so a GPU test would pass alone and
    fail in a full run. Every function a GPU-marked test launches is module-level (CPU tests fork,
    which carries closures, and some test exactly that)."""
    bad = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        bad += [f"{path.relative_to(REPO)}:{where}" for where in _local_functions_launched(ast.parse(path.read_text()))]
    assert bad == [], "define these launched functions at module level: " + ", ".join(bad)


# --- no aliases, and one concept per parallel package ------------------------------------------


def _aliases(tree: ast.AST) -> list[int]:
    """Lines of ``sys.modules[...] = module`` assignments and module-level ``__getattr__`` functions.
    Not aliases: a method named ``__getattr__``, and a name set to None (that blocks an import)."""
    found = [node.lineno for node in getattr(tree, "body", [])
             if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            found += [node.lineno for t in node.targets
                      if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules"]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.modules.setdefault", "sys.modules.update"):
            if not (len(node.args) == 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value is None):
                found.append(node.lineno)
    return sorted(found)


def test_the_alias_finder_sees_both_kinds() -> None:
    tree = ast.parse("import sys\nsys.modules['a.b'] = m\nsys.modules.setdefault('c', m)\n"
                     "def __getattr__(name):\n    return 1\nclass C:\n    def __getattr__(self, n):\n        return 2\n"
                     "sys.modules['blocked'] = None\nsys.modules.setdefault('blocked2', None)\n")
    assert _aliases(tree) == [2, 3, 4]


def test_no_module_aliases() -> None:
    """Old import paths are not kept alive: every module is imported by its one canonical path."""
    bad = [f"{path.relative_to(REPO)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
           for line in _aliases(ast.parse(path.read_text()))]
    assert bad == [], "sys.modules / module __getattr__ aliases: " + ", ".join(bad)


# which gpulab.parallel packages each one may import: the launcher serves every other, DDP never
# reaches into sharding (lab 09 builds on lab 06, not the reverse), and the DDP algorithm stands
# without what lab 06 builds around it (its measurements, workloads, sampler and mixed precision)
PARALLEL_MAY_NOT_IMPORT = {
    "gpulab.parallel.launcher": ("gpulab.parallel.ddp", "gpulab.parallel.sharding", "gpulab.parallel.pipeline",
                                 "gpulab.parallel.tp", "gpulab.parallel.dp"),
    "gpulab.parallel.ddp": ("gpulab.parallel.sharding", "gpulab.parallel.pipeline", "gpulab.parallel.tp",
                            "gpulab.parallel.measure", "gpulab.parallel.workloads", "gpulab.parallel.sampler",
                            "gpulab.parallel.amp"),
}


def test_each_parallel_package_holds_one_concept() -> None:
    bad = sorted(f"{m} imports {t}" for m, ts in import_graph().items() for pkg, banned in PARALLEL_MAY_NOT_IMPORT.items()
                 if m == pkg or m.startswith(pkg + ".") for t in ts if t.startswith(banned))
    assert bad == [], "; ".join(bad)


def test_gpipes_step_and_zero1s_step_read_in_one_file() -> None:
    """A student follows lab 07's and lab 09's reference from its own file: nothing it imports from
    its package holds algorithm (GPipe: only the timeline's StageEvent; ZeRO-1: only checkpoints)."""
    graph = import_graph()
    assert {t for t in graph["gpulab.parallel.pipeline.gpipe"] if t.startswith("gpulab.parallel.pipeline")} == {
        "gpulab.parallel.pipeline.bubble"}
    assert {t for t in graph["gpulab.parallel.sharding.zero1"] if t.startswith("gpulab.parallel")} == {
        "gpulab.parallel.sharding.checkpoint"}
