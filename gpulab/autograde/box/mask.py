"""Masked references: gpulab's own version of a lab's exercises does not exist in a graded kernel.

A student who calls gpulab's reference instead of writing the exercise would send correct
evidence. So while a lab is graded, each reference in its grader's ``REFERENCES`` is replaced, in
the submission's mount namespace, by a stub that raises :class:`gpulab.MaskedReference`: the
module's file is bound over by a copy whose masked definitions keep their names and signatures
and lose their bodies and docstrings. Everything else in that file, and the rest of gpulab, works
as usual. Because the file itself is masked, ``inspect.getsource`` and a plain ``open`` of it show
the stub too; compiled copies in ``__pycache__`` are covered by an empty file, so Python
recompiles the stub (:mod:`gpulab.confine.nsinit` mounts both, ``--bind``).

    binds = write_masks(REFERENCES, root / "masks" / lab)   # [(masked copy, original file), ...]

The reference kernel, which computes the expected values, runs without masks.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Iterable


class MaskError(ValueError):
    """A reference that cannot be masked (not a module-level function or class of a .py file)."""


def _target(ref: Any) -> tuple[Path, str, str]:
    """(source file, top-level name, dotted name) of a reference."""
    obj = getattr(ref, "__func__", ref)
    module = inspect.getmodule(obj)
    name = getattr(obj, "__name__", None)
    if module is None or name is None or getattr(module, name, None) is not obj or "." in obj.__qualname__:
        raise MaskError(f"{ref!r} is not a module-level function or class; only those can be masked")
    path = inspect.getsourcefile(module)
    if path is None:
        raise MaskError(f"{module.__name__} has no source file to mask")
    return Path(path).resolve(), name, f"{module.__name__}.{name}"


def _offsets(source: str) -> list[int]:
    starts, pos = [0], 0
    for line in source.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def _stub(dotted: str) -> str:
    return (f"raise __import__('gpulab').MaskedReference({dotted!r})  "
            "# masked while this lab is graded (gpulab.autograde.box.mask)")


def mask_source(source: str, names: dict[str, str]) -> str:
    """``source`` with the bodies of the top-level functions and classes in ``names`` (name ->
    dotted name) replaced by a raise of :class:`gpulab.MaskedReference`; a class keeps its bases
    and attributes, and each of its methods raises."""
    tree = ast.parse(source)
    starts = _offsets(source)
    spans: list[tuple[int, int, str]] = []  # (start, end, replacement) in character offsets

    def replace_body(body: list[ast.stmt], dotted: str) -> None:
        first, last = body[0], body[-1]
        spans.append((starts[first.lineno - 1] + first.col_offset, starts[last.end_lineno - 1] + last.end_col_offset,
                      _stub(dotted)))

    found = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            replace_body(node.body, names[node.name])
            found.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name in names:
            found.add(node.name)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    replace_body(item.body, f"{names[node.name]}.{item.name}")
                elif isinstance(item, ast.Expr) and isinstance(getattr(item, "value", None), ast.Constant) \
                        and isinstance(item.value.value, str):  # the class docstring
                    spans.append((starts[item.lineno - 1] + item.col_offset,
                                  starts[item.end_lineno - 1] + item.end_col_offset, "pass"))
    missing = set(names) - found
    if missing:
        raise MaskError(f"not defined at the top level of the module: {', '.join(sorted(missing))}")
    out = source
    for start, end, text in sorted(spans, reverse=True):
        out = out[:start] + text + out[end:]
    ast.parse(out)  # the stub must still be valid Python
    return out


def write_masks(references: Iterable[Any], folder: Path) -> list[tuple[Path, Path]]:
    """Write a masked copy of every module holding one of ``references`` under ``folder``.

    Returns:
        ``(masked copy, original)`` pairs to bind, the modules' compiled copies included (bound
        by an empty file).

    Raises:
        MaskError: for a reference that cannot be masked.
    """
    by_file: dict[Path, dict[str, str]] = {}
    for ref in references:
        path, name, dotted = _target(ref)
        by_file.setdefault(path, {})[name] = dotted
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    empty = folder / "empty.pyc"
    empty.write_bytes(b"")
    empty.chmod(0o644)
    binds = []
    for i, (path, names) in enumerate(sorted(by_file.items())):
        copy = folder / f"{i:02d}-{path.name}"
        copy.write_text(mask_source(path.read_text(), names))
        copy.chmod(0o644)
        binds.append((copy, path))
        cache = Path(importlib.util.cache_from_source(str(path)))
        for compiled in cache.parent.glob(f"{path.stem}.*.pyc") if cache.parent.is_dir() else []:
            binds.append((empty, compiled))
    return binds


def masked_names(references: Iterable[Any]) -> list[str]:
    """The dotted names of ``references`` (for the docs and the notes)."""
    return [_target(ref)[2] for ref in references]


def lab_references(lab: str) -> tuple:
    """The ``REFERENCES`` of a lab's grader module (``00_setup`` -> ``gpulab.grading.lab00``)."""
    try:
        module = importlib.import_module(f"gpulab.grading.lab{lab[:2]}")
    except ModuleNotFoundError:
        return ()
    return tuple(getattr(module, "REFERENCES", ()))
