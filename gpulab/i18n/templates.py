"""Texts whose values are only known when they run: an f-string's ``what=``/``hint=``, a demo
cell's ``print(f"... {x} ...")`` (or ``print("... %s ..." % x)``). Each becomes a template, its values numbered in order
(``"{0} of {1} ranks answered"``), with the expression each number stands for beside it for the
translator. A translation may put the numbers in any order (Korean often must).

At run time the text as it came out is matched against the English templates, and the values
found are put into the translation. Nothing is evaluated, so a text that matches no template (the
code changed, a value holds a line break the template did not expect) stays in English.

Imported by the graders' judge and by every kernel that runs in a language: standard library only.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass
from typing import Callable, Iterable

FLAG = "python-brace-format"  # gettext's own flag for a msgid with {0}-style fields
_FORMATTER = string.Formatter()


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _flat(parts: Iterable[ast.expr]) -> list[ast.expr]:
    """The parts, each ``"a" + f"b{x}"`` read as its pieces, with a ``None`` between two parts (where
    ``print`` writes its separator); the pieces of one sum have nothing between them."""
    out: list = []
    for node in parts:
        if out:
            out.append(None)
        out += _added(node)
    return out


def _added(node: ast.expr) -> list:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and texty(node.left) and texty(node.right):
        return [*_added(node.left), *_added(node.right)]
    return [node]


_PERCENT = re.compile(r"(%%|%(?:\([^)]*\))?[#0 +-]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa])")


def _percent(node: ast.expr) -> bool:
    """``"text %s" % values``: printf-style formatting of a literal (no mapping keys)."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str) and "%(" not in node.left.value
            and bool(_PERCENT.search(node.left.value)))


def texty(node: ast.expr) -> bool:
    """Whether ``node`` is a string, an f-string, a printf-style format, or a sum of them."""
    return _percent(node) or (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr) \
        or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and texty(node.left) and texty(node.right))


def from_parts(parts: Iterable[ast.expr], sep: str = "") -> tuple[str, list[str]] | None:
    """The template of ``parts`` joined by ``sep`` (an f-string's pieces, or ``print``'s arguments),
    and the source of each value; None when no part is text (``print(x)`` has nothing to translate)."""
    pieces: list[str] = []
    values: list[str] = []
    text = False

    def value(node: ast.expr) -> str:
        values.append(ast.unparse(node))
        return "{" + str(len(values) - 1) + "}"

    for node in _flat(parts):
        if node is None:
            pieces.append(_literal(sep))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            pieces.append(_literal(node.value))
            text = text or any(ch.isalpha() for ch in node.value)
        elif _percent(node):  # "allocated %s, reserved %s" % stats()
            right = node.right
            specs = [m for m in _PERCENT.findall(node.left.value) if m != "%%"]
            given = right.elts if isinstance(right, ast.Tuple) else [right] if len(specs) == 1 else None
            k = 0
            for n, piece in enumerate(_PERCENT.split(node.left.value)):
                if n % 2 == 0 or piece == "%%":
                    pieces.append(_literal(piece.replace("%%", "%") if n % 2 else piece))
                    text = text or any(ch.isalpha() for ch in piece)
                else:
                    values.append(ast.unparse(given[k]) if given and k < len(given) else f"({ast.unparse(right)})[{k}]")
                    pieces.append("{" + str(len(values) - 1) + "}")
                    k += 1
        elif isinstance(node, ast.JoinedStr):
            for piece in node.values:
                if isinstance(piece, ast.Constant):
                    pieces.append(_literal(piece.value))
                    text = text or any(ch.isalpha() for ch in piece.value)
                else:
                    pieces.append(value(piece.value if isinstance(piece, ast.FormattedValue) else piece))
        else:
            pieces.append(value(node))
    return ("".join(pieces), values) if text else None


def _literal_length(template: str) -> int:
    try:
        return sum(len(literal) for literal, *_ in _FORMATTER.parse(template))
    except ValueError:
        return 0


def fields(template: str) -> list[str]:
    """The field names of a template, in order (``ValueError`` if its braces do not pair)."""
    return [name for _, name, _, _ in _FORMATTER.parse(template) if name is not None]


@dataclass(frozen=True)
class Template:
    english: str
    translation: str
    pattern: re.Pattern[str]
    literals: tuple[str, ...]  # the text between the values, in order: "" before a leading value

    @classmethod
    def compile(cls, english: str, translation: str) -> "Template":
        regex, literals = [], []
        value = ".*?" if "\n" in english else "[^\n]*?"  # a one-line template takes one line's values
        for literal, name, _, _ in _FORMATTER.parse(english):
            regex.append(re.escape(literal))
            literals.append(literal)
            if name is not None:
                regex.append(f"(?P<v{int(name)}>{value})")  # numbered 0, 1, ... once each, by from_parts
        if literals and english.endswith("}") and not english.endswith("}}"):
            literals.append("")
        return cls(english, translation, re.compile("".join(regex), re.S), tuple(literals))

    def could_match(self, text: str) -> bool:
        """A cheap test first: the regex of a template whose values sit side by side can take very
        long to fail on a long text that is nearly a match (a doctor's report, a table)."""
        if "\n" in text and "\n" not in self.english:
            return False
        if not (text.startswith(self.literals[0]) and text.endswith(self.literals[-1])):
            return False
        at = len(self.literals[0])
        for literal in self.literals[1:-1]:
            at = text.find(literal, at)
            if at < 0:
                return False
            at += len(literal)
        return len(text) - at >= len(self.literals[-1])

    def apply(self, text: str, value: Callable[[str], str] | None = None) -> str | None:
        """The translation with the values ``text`` holds (each through ``value`` if given), or None."""
        if len(self.literals) > 1 and not self.could_match(text):
            return None
        m = self.pattern.fullmatch(text)
        if m is None:
            return None
        values = [m.group(f"v{i}") for i in range(len(set(fields(self.english))))]
        return self.translation.format(*(map(value, values) if value else values))


class Matcher:
    """Exact texts first, then templates, the most literal text first (the most specific wins)."""

    def __init__(self, exact: dict[str, str], templates: dict[str, str]) -> None:
        self.exact = dict(exact)
        self.templates = []
        for english, translation in sorted(templates.items(), key=lambda kv: -_literal_length(kv[0])):
            try:
                self.templates.append(Template.compile(english, translation))
            except (ValueError, KeyError, IndexError, re.error):
                continue  # a broken entry stays English; make i18n-check names it

    def __bool__(self) -> bool:
        return bool(self.exact or self.templates)

    def translate(self, text: str, nested: bool = False) -> str | None:
        """``text`` translated, or None; ``nested``: a value that is itself a text of the catalogue
        (a verdict's `` at [0]['x']``) is translated too, one level deep."""
        if text in self.exact:
            return self.exact[text]
        inner = (lambda v: self.translate(v) or v) if nested else None
        for t in self.templates:
            try:
                out = t.apply(text, inner)
            except (ValueError, KeyError, IndexError):
                continue
            if out is not None:
                return out
        return None


def problems(english: str, translation: str) -> list[str]:
    """What a template's translation must keep: every value, once each at least, and nothing more."""
    try:
        want = set(fields(english))
    except ValueError as err:
        return [f"the English template does not parse ({err})"]
    try:
        have = set(fields(translation))
    except ValueError as err:
        return [f"its braces do not pair ({err}): write a literal brace as {{{{ or }}}}"]
    out = []
    if want - have:
        out.append(f"the value(s) {', '.join('{' + n + '}' for n in sorted(want - have))} are missing")
    if have - want:
        out.append(f"the value(s) {', '.join('{' + n + '}' for n in sorted(have - want))} are not in the English")
    return out
