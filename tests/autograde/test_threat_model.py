"""The README's safety paragraph is the threat model's summary, sentence for sentence (issue 15:
the README claims no more than docs/instructor.md's threat model)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START = "One bad submission never stops the class"


def _paragraph(text: str) -> str:
    i = text.index(START)
    return re.sub(r"\s+", " ", text[i:text.index("\n\n", i)]).strip()


def test_readme_safety_paragraph_matches_the_threat_model_word_for_word() -> None:
    docs = (REPO / "docs" / "instructor.md").read_text()
    model = docs[docs.index("### Threat model"):]
    readme = (REPO / "README.md").read_text()
    assert readme.count(START) == 1 and model.count(START) == 1
    assert _paragraph(readme) == _paragraph(model)
    # the paragraph names every OS layer the threat model relies on
    for layer in ("namespaces", "cgroup", "identity of its own", "Landlock", "ALLOW_WEAKER_SANDBOX=1"):
        assert layer in _paragraph(model), layer
