"""What the demo cells print, in the student's language: a third catalogue per lab,
``notebooks/i18n/<lang>/<lab>.output.po``, with one template per ``print(...)`` of a demo or test
cell (not of a solution cell: the student writes that one).

The code stays the English code. In a kernel started with ``GPULAB_LANG`` (``make lab LANG=ko``),
importing gpulab wraps the kernel's standard output: each printed line is matched against the
templates and written translated, with the values it printed (:mod:`gpulab.i18n.templates`).
Whatever matches nothing (a value, a table row, a library's report) is written as it came.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from typing import Any, Callable

from gpulab.i18n import LANGUAGES, templates

SUFFIX = ".output"


def output_path(course: Path, lang: str, lab: str) -> Path:
    return course / "i18n" / lang / f"{lab}{SUFFIX}.po"


def _prints(tree: ast.AST) -> dict[str, list[str]]:
    """``{template: the source of each value}`` for every ``print(...)`` to standard output with text."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        if "file" in kw or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        sep = kw.get("sep")
        if sep is not None and not (isinstance(sep, ast.Constant) and isinstance(sep.value, str)):
            continue
        made = templates.from_parts(node.args, " " if sep is None else sep.value)
        if made:
            found.setdefault(*made)
    return found


def cells(nb_path: Path) -> list[Any]:
    """One ``catalog.Cell`` per distinct printed template of each code cell but the solutions (the
student writes those), keyed ``<cell id>:p<n>``."""
    import nbformat

    from gpulab.i18n import catalog, messages

    nb = nbformat.read(str(nb_path), as_version=4)
    out = []
    for i, c in enumerate(nb.cells):
        meta = c.metadata.get("nbgrader", {}) if c.cell_type == "code" else {}
        tree = messages.parse_cell(c.source) if c.cell_type == "code" and not meta.get("solution") else None
        if tree is None:
            continue
        kind = "test" if meta.get("grade") else "demo"
        out += [catalog.Cell(f"{c.id}:p{n}", text, f"printed by {kind} cell {i}" + messages.values_note(values),
                             frozenset({templates.FLAG}))
                for n, (text, values) in enumerate(_prints(tree).items())]
    return out


@functools.cache
def table(lang: str) -> templates.Matcher:
    from gpulab.i18n import messages

    return messages.matcher(lang, SUFFIX)


class Translating:
    """Wraps a stream's ``write`` and ``flush``: text is held until a write ends a line (``print``
    writes its arguments, separators and end one by one), then written translated."""

    def __init__(self, write: Callable[[str], Any], flush: Callable[[], Any], matcher: templates.Matcher) -> None:
        self._write, self._flush, self._matcher = write, flush, matcher
        self._held: list[str] = []

    def write(self, text: str) -> int:
        if not isinstance(text, str) or "\r" in text:  # a progress line redrawn in place: as it comes
            self.release()
            return self._write(text)
        self._held.append(text)
        if text.endswith("\n"):
            self.release()
        return len(text)

    def release(self) -> None:
        if not self._held:
            return
        text, self._held = "".join(self._held), []
        try:
            out = self.translate(text)
        except Exception:  # a translation never costs the student a line of output
            out = text
        self._write(out)

    def flush(self) -> Any:
        self.release()
        return self._flush()

    def translate(self, text: str) -> str:
        body, end = (text[:-1], "\n") if text.endswith("\n") else (text, "")
        whole = self._matcher.translate(body) if body.strip() else None
        if whole is None and end and body.strip():  # print(f"...\n"): the text's own newline came before end's
            whole = self._matcher.translate(body + "\n")
            whole = whole[:-1] if whole is not None and whole.endswith("\n") else whole
        if whole is not None:
            return whole + end
        lines = body.split("\n")
        done = [self._matcher.translate(line) if line.strip() else None for line in lines]
        return "\n".join(line if t is None else t for line, t in zip(lines, done)) + end


def install(lang: str | None) -> bool:
    """Translate what this kernel prints to standard output into ``lang``; True if it now does.
    Only in an IPython kernel, once, and only where the language has output catalogues."""
    if not lang or lang not in LANGUAGES or "ipykernel" not in sys.modules:
        return False
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    if shell is None:
        return False
    if getattr(shell, "_gpulab_output", None) is not None:
        return True
    try:
        matcher = table(lang)
    except Exception:  # never let a translation stop the lab: it runs in English
        return False
    if not matcher:
        return False
    stream = sys.stdout
    wrapper = Translating(stream.write, stream.flush, matcher)

    def wrap(*_: Any) -> None:
        # IPython (9+) swaps the stream's write for a recording one around each cell and puts the
        # old one back after it, so the translation goes on top again as each cell starts
        if not isinstance(stream.write, _Bound):
            wrapper._write = stream.write
            stream.write = _Bound(wrapper.write)

    wrap()
    stream.flush = wrapper.flush  # the stream stays the kernel's own object (ipykernel checks its type)
    shell.events.register("pre_run_cell", wrap)
    shell.events.register("post_run_cell", lambda *_: wrapper.release())
    shell._gpulab_output = wrapper
    return True


class _Bound:
    """A marker around the wrapped ``write``, so a second import does not wrap it twice."""

    def __init__(self, fn: Callable[[str], int]) -> None:
        self._fn = fn

    def __call__(self, text: str) -> int:
        return self._fn(text)
