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

LANGUAGES = {"ko": "한국어"}
