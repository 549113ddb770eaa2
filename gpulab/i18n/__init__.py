"""Translated editions of the labs, from one source of truth (``make lab LANG=ko``).

The English source notebooks stay the only hand-edited copy of each lab. A translation lives in a
gettext catalogue per lab, ``notebooks/i18n/<lang>/<lab>.po``: one entry per markdown cell, keyed
by the cell's id (``msgctxt``), with the English text as ``msgid``. Code cells are never
translated, so grade ids, points and hidden tests are the same in every language.

- ``catalog``: read the cells to translate, and merge them into a catalogue (``update``): a cell
  whose English changed keeps its old translation, flagged fuzzy, with the old English beside it;
- ``checks``: what ``make i18n-check`` refuses (a missing, fuzzy, stale or orphaned entry, a code
  span, number or link lost, a glossary term translated two ways);
- ``build``: the translated course root that ``make release LANG=ko`` and ``make lab LANG=ko`` use.
"""

from typing import NamedTuple


class Language(NamedTuple):
    """What the kit says in a language besides its catalogues (imported by the graders' judge: keep light)."""

    name: str          # the language's own name, in command output
    hint: str          # the label before a check's hint
    untranslated: str  # the first cell of a lab that has no catalogue yet


LANGUAGES = {"ko": Language("한국어", "힌트", "> 이 실습은 아직 한국어로 옮겨지지 않아 영어 원문으로 제공됩니다.")}
