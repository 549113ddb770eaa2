"""The words of every verdict the judge writes: one table, id -> English template.

:mod:`gpulab.verdict.check` writes each failed check's detail with :func:`text`
(``text("close.unequal", "4", "5", "")`` is ``"expected 4, got 5"``); the kit's catalogue
``notebooks/i18n/<lang>/gpulab.judge.po`` is this table (:func:`gpulab.i18n.messages.judge_cells`),
one entry per id, and :func:`gpulab.i18n.messages.say` matches a detail as it came out against
these templates to put it in the student's language. A template's ``{n}`` are the values, already
written as text by the caller (a repr, a number formatted ``.4g``); ``values`` says what each
stands for, for the translator.

The table lives beside the catalogues it feeds, not in :mod:`gpulab.verdict`: the verdicts import
the translations, never the reverse (``tests/test_layout.py``). Standard library only: every
kernel that checks an answer imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Text", "TEXTS", "text"]


@dataclass(frozen=True)
class Text:
    template: str            # English, its values numbered {0}, {1}, ... (gettext's python-brace-format)
    values: tuple[str, ...] = ()  # what each {n} stands for


_WHERE = "where in the value (' at [0][1]'), or nothing"

# in the order the catalogue lists them; a changed template makes its translation fuzzy
TEXTS: dict[str, Text] = {
    "close.at": Text(" at {0}", ("the index or key path, e.g. [0]['w']",)),
    "close.not_tensor": Text("expected a torch.Tensor{0}, got {1}", (_WHERE, "the kind of value it got")),
    "close.shape": Text("shape {0} but expected {1}{2}", ("the shape it got", "the expected shape", _WHERE)),
    "close.dtype": Text("dtype torch.{0} but expected torch.{1}{2}", ("the dtype it got", "the expected dtype", _WHERE)),
    "close.values_missing": Text("values missing{0}", (_WHERE,)),
    "close.not_number": Text("expected a number{0}, got {1}", (_WHERE, "the kind of value it got")),
    "close.not_sequence": Text("expected a sequence{0}, got {1}", (_WHERE, "the kind of value it got")),
    "close.length": Text("length {0} but expected {1}{2}", ("the length it got", "the expected length", _WHERE)),
    "close.not_mapping": Text("expected a mapping{0}, got {1}", (_WHERE, "the kind of value it got")),
    "close.keys": Text("keys {0} but expected {1}{2}", ("the keys it got", "the expected keys", _WHERE)),
    "close.unequal": Text("expected {0}, got {1}{2}", ("the expected value", "the value it got", _WHERE)),
    "close.scalars": Text("values differ (Scalars are not close!; Expected {0} but got {1}; Absolute difference: {2} "
                          "(up to {3} allowed); Relative difference: {4} (up to {5} allowed)){6}",
                          ("the expected number", "the number it got", "their absolute difference", "atol",
                           "their relative difference", "rtol", _WHERE)),
    "close.tensors": Text("values differ (Tensor-likes are not close!; Mismatched elements: {0} / {1} ({2}%); "
                          "Greatest absolute difference: {3} at index {4} (up to {5} allowed)){6}",
                          ("elements not close", "all elements", "their percentage", "the greatest difference",
                           "its index", "atol", _WHERE)),
    "true.failed": Text("check failed"),
    "shape.not_tensor": Text("expected a torch.Tensor, got {0}", ("the kind of value it got",)),
    "shape.differs": Text("shape {0} but expected {1}", ("the shape it got", "the expected shape")),
    "rule.unreadable": Text("the check's parameters could not be read"),
    "check.unknown": Text("the grader does not know the check {0}", ("the check's kind, quoted",)),
    "equal.at": Text("at {0}: ", ("the index or key path, e.g. [0]['w']",)),
    "equal.container": Text("{0}expected a {1}, got a {2} ({3})",
                            ("where ('at [0]: '), or nothing", "the expected type", "the type it got", "the value it got")),
    "equal.differs": Text("{0}expected {1}, got {2}",
                          ("where ('at [0]: '), or nothing", "the expected value", "the value it got")),
    "between.not_number": Text("expected a number, got {0}", ("the kind of value it got",)),
    "between.nan": Text("got NaN"),
    "between.below": Text("{0} is below the minimum {1}", ("the value", "the minimum")),
    "between.above": Text("{0} is above the maximum {1}", ("the value", "the maximum")),
    "raises.any": Text("an exception"),
    "raises.nothing": Text("expected {0}, but nothing was raised", ("the exception types expected",)),
    "raises.other": Text("expected {0}, got {1}: {2}",
                         ("the exception types expected", "the type raised", "its message")),
    "raises.message": Text("raised {0} but its message does not mention {1}: {2}",
                           ("the type raised", "the text expected in the message, quoted", "its message")),
}


def text(key: str, *values: object) -> str:
    """The English verdict ``key`` with its values (each written with ``str``) in place.

    Raises:
        KeyError: ``key`` is not in :data:`TEXTS`.
        ValueError: the number of values is not the template's.
    """
    t = TEXTS[key]
    if len(values) != len(t.values):
        raise ValueError(f"the verdict {key!r} takes {len(t.values)} value(s) ({'; '.join(t.values) or 'none'}), "
                         f"got {len(values)}")
    return t.template.format(*values)
