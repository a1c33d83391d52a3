"""citations: how generated text cites its sources, and which of its figures no source holds.

The one rule for every check of what a writer (a model, or the extractive answerer) wrote:
the server's audit of an answer (services/responder/answer_audit.py), the `complete`
metadata's `cited` flags (finalize), the extractive answer's markers (extractive.py),
`concierge eval answers` (cli/measure/answer_eval.py) and the lead briefs' numeric audit
(services/enricher/briefs/document.py). A figure the writer wrote that no input holds is
likely invented; it is flagged for review, never blocked.

- A citation: `[n]`, `[n, m]` (and `[1][2]`, two markers). An answer cites a source when a
  marker names a document it was given (`cited`).
- A figure: digits with their decimals, thousands separators and a trailing `%` ("$29",
  "99.95%", "5,000", "1 200", "40 %", "TLS 1.3"). Not figures: citation markers, the
  numbering of a list item or a heading ("1. " at a line's start, "## 2) Needs"), digits
  inside a link or an e-mail address of the text checked (a link is checked as a link, not
  as a claim of a number; a reference's links do hold figures), digits glued to a letter
  before them ("B2B", "v2").
- Figures compare by value, written any way a visitor's language writes it:
  "5,000" = "5 000" = "5.000" = "5000" (a group of exactly three digits after a separator
  is a thousands group: a German answer writes €1,500 as "1.500 €"); "1,5" = "1.5" =
  "1.50"; "40 %" = "40%" = "40" (a percentage is supported by its bare number: sources
  write "40 percent" too); a currency sign is not part of the figure ("$29" = "29 €").
- A figure is supported when a reference holds the same value as a figure, or, for 0 to
  20, as an English word ("two to four weeks" supports "2-4 weeks"): the writer may
  paraphrase a number, not invent one. Each unsupported figure is listed once (by value),
  as first written.
- An answer's references: every document it was given, title and text (not only the one
  it cites: a figure from a source it was given is not invented; which source a sentence
  cites is the citation's question), every message the visitor wrote in the conversation,
  and the site's own words a reply repeats (its CTA label, the qualifying question asked).

Choices where earlier rules differed: a number word or a decimal-comma language's "1.500"
supports a figure (a paraphrase or a translation is not an invention); "5,000" is never 5
(every source holds a stray 5, so an invented "$5,000" would pass); "1 200" is one figure;
the site's words are references, the rest of a turn's metadata is not (suggestions, turn
numbers; the visitor's enriched profile, which the answer is told not to recite).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# One marker; no group, so the pattern can sit inside another (streaming's sentence pattern).
CITATION = re.compile(r"\[\d+(?:\s*,\s*\d+)*\]")
LIST_NUMBER = re.compile(r"^\s*(?:#{1,6}\s+)?\d{1,2}[.)]\s", re.MULTILINE)
LINK = re.compile(r"(?:https?://|www\.|mailto:)\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
SPACES = " \u00a0\u2009\u202f"
# Space-grouped thousands first ("1 200"), so a lone "1" before "200" is not taken as a figure
# of its own; each group exactly three digits, so "in 2024 300 users" stays two figures.
FIGURE = re.compile(rf"(?<![\w.])(?:\d{{1,3}}(?:[{SPACES}]\d{{3}}(?!\d))+|\d+)(?:[.,]\d+)*(?:[{SPACES}]?%)?")
COMMA_THOUSANDS = re.compile(r"[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")  # 5,000 / 1,250.50
DOT_THOUSANDS = re.compile(r"[1-9]\d{0,2}(?:\.\d{3})+(?:,\d+)?")  # 5.000 / 1.250,50
DECIMAL = re.compile(r"(\d+)(?:\.(\d+))?")
WORD = re.compile(r"[^\W\d_]+")
NUMBER_WORDS = {w: str(i) for i, w in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"))}


def cited(text: str, given: Iterable[int] | None = None) -> list[int]:
    """The document numbers the text cites, in order of first citation; only those in
    `given` when it is passed."""
    allowed = None if given is None else set(given)
    found: list[int] = []
    for marker in CITATION.finditer(text):
        for n in map(int, re.findall(r"\d+", marker.group())):
            if n not in found and (allowed is None or n in allowed):
                found.append(n)
    return found


def without_citations(text: str) -> str:
    """The text without its citation markers and the spaces before them."""
    return re.sub(rf"\s*{CITATION.pattern}", "", text)


def figures(text: str, *, links: bool = False) -> list[str]:
    """The figures written in `text`, as written: no citation marker nor list numbering, and
    none inside a link or an e-mail address unless `links`."""
    text = LIST_NUMBER.sub(" ", CITATION.sub(" ", text))
    return [m.group(0) for m in FIGURE.finditer(text if links else LINK.sub(" ", text))]


def value(figure: str) -> str:
    """The figure's value, as compared: no `%`, no thousands separators, a decimal point,
    no leading or trailing zero ("1.50" → "1.5"); a dotted version ("3.5.1") as written."""
    digits = figure.rstrip("%").translate({ord(c): None for c in SPACES})
    if COMMA_THOUSANDS.fullmatch(digits):
        digits = digits.replace(",", "")
    elif DOT_THOUSANDS.fullmatch(digits):
        digits = digits.replace(".", "").replace(",", ".")
    else:
        digits = digits.replace(",", ".")
    decimal = DECIMAL.fullmatch(digits)
    if not decimal:
        return digits
    whole, fraction = str(int(decimal.group(1))), (decimal.group(2) or "").rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def values(text: str) -> set[str]:
    """Every value `text` supports: its figures' (those in its links too: "ops-314@" holds
    314), and those of its number words."""
    return {value(f) for f in figures(text, links=True)} | {
        NUMBER_WORDS[w] for w in WORD.findall(text.casefold()) if w in NUMBER_WORDS}


def unsupported(text: str, references: Iterable[str]) -> list[str]:
    """The figures of `text` whose value no reference supports, each value once, as first
    written in `text`."""
    known = set().union(*(values(reference) for reference in references))
    out: dict[str, str] = {}
    for figure in figures(text):
        if value(figure) not in known:
            out.setdefault(value(figure), figure)
    return list(out.values())
