"""Figures written in a text, and which of them no reference text holds.

Both audits of generated text use it: an answer's figures against its sources and the
visitor's messages (services/responder/citations.py), a lead brief's against everything it
was given (services/enricher/briefs/document.py). A figure the model wrote that no input
holds is likely invented.

- A figure: digits with their decimals, thousands separators and a trailing `%`
  ("$29", "99.95%", "5,000", "1 200", "40 %", "TLS 1.3"). Thousands may be separated by a
  comma or by a space (normal, no-break, thin or narrow no-break), as French and German
  typography write them.
- Citation markers (`[1]`, `[1, 2]`) and the numbering of a list item or a heading ("1. " at
  a line's start, "## 2) Needs") are not figures.
- Figures compare by their normalized digits: "5,000" = "5 000" = "5000", "40 %" = "40%"
  = "40" (a percentage is supported by its bare number: sources write "40 percent" too),
  "1,5" = "1.5"; "1.500" is not 1500 (English sources write decimals with a point).
"""

from __future__ import annotations

import re

CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
LIST_NUMBER = re.compile(r"^\s*(?:#{1,6}\s+)?\d{1,2}[.)]\s", re.MULTILINE)
SPACES = " \u00a0\u2009\u202f"
# Space-grouped thousands first ("1 200"), so a lone "1" before "200" is not taken as a figure
# of its own; each group exactly three digits, so "in 2024 300 users" stays two figures.
FIGURE = re.compile(rf"(?<![\w.])(?:\d{{1,3}}(?:[{SPACES}]\d{{3}}(?!\d))+|\d+)(?:[.,]\d+)*(?:[{SPACES}]?%)?")
COMMA_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def figures(text: str) -> list[str]:
    """The figures written in `text`, as written, citation markers and list numbering left out."""
    text = LIST_NUMBER.sub(" ", CITATION.sub(" ", text))
    return [m.group(0) for m in FIGURE.finditer(text)]


def normalized(figure: str) -> str:
    """The figure's digits, as compared: no `%`, no thousands separators, a decimal point."""
    digits = figure.rstrip("%").translate({ord(c): None for c in SPACES})
    if COMMA_THOUSANDS.fullmatch(digits):  # 5,000 / 1,250.50
        digits = digits.replace(",", "")
    return digits.replace(",", ".")


def ungrounded(text: str, references: list[str]) -> list[str]:
    """The figures of `text` that appear in none of the reference texts, each once, as
    written in `text`."""
    known = {normalized(f) for reference in references for f in figures(reference)}
    out: list[str] = []
    for figure in figures(text):
        if normalized(figure) not in known and figure not in out:
            out.append(figure)
    return out
