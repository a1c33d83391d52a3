"""citations: what an answer cited, and whether its figures come from somewhere.

Checked on the server for every answer backend (the LLM may forget to cite, or write a
number no source holds), recorded on `ResponseCompleted` (`uncited`,
`unsupported_numbers`) and shown per source in the turn's metadata (`cited`). The audit
never blocks an answer: the text has already streamed; it is a flag to count and review.

- Citations: `[n]` (also `[1, 2]`, `[1][2]`) naming a document the answer was given.
- Numbers: digits with their decimals, thousands separators, and a trailing `%`
  ("$29", "99.95%", "5,000", "TLS 1.3"), compared as normalized digits ("5,000" = "5000");
  an answer's number is supported when a source's text or the visitor's messages hold it.
  Citation markers and list numbering ("1. ") are not figures.
"""

from __future__ import annotations

import logging
import re
from collections import Counter

from shared import events as ev

log = logging.getLogger(__name__)

CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*%?")
LIST_NUMBER = re.compile(r"^\s*\d{1,2}[.)]\s", re.MULTILINE)
# Flagged answers since the process started, by flag: a log counter (see docs/operations.md).
FLAGGED: Counter[str] = Counter()


def cited(text: str, given: list[int] | None = None) -> list[int]:
    """The document numbers the text cites, in order of first citation; only those in
    `given` when it is passed."""
    numbers: list[int] = []
    for match in CITATION.finditer(text):
        for part in match.group(1).split(","):
            n = int(part)
            if n not in numbers and (given is None or n in given):
                numbers.append(n)
    return numbers


def _normalized(number: str) -> str:
    digits = number.rstrip("%")
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", digits):  # 5,000 / 1,250.50
        digits = digits.replace(",", "")
    return digits.replace(",", ".")


def numbers(text: str) -> list[str]:
    """The figures written in `text`, as written, citation markers and list numbering left out."""
    text = LIST_NUMBER.sub(" ", CITATION.sub(" ", text))
    return [m.group(0) for m in NUMBER.finditer(text)]


def unsupported_numbers(answer: str, references: list[str]) -> list[str]:
    """The answer's figures that appear in none of the reference texts (sources, the
    visitor's messages), each once, as written in the answer."""
    known = {_normalized(n) for text in references for n in numbers(text)}
    out: list[str] = []
    for number in numbers(answer):
        if _normalized(number) not in known and number not in out:
            out.append(number)
    return out


def audit(answer: str, documents: list[ev.RetrievedDocument], conversation: list[str], *,
          declined: bool = False) -> tuple[bool, list[str]]:
    """(uncited, unsupported numbers) of an answer given `documents` to cite. An answer
    that declined (said it found nothing) claims nothing, so needs no citation."""
    uncited = bool(documents) and not declined and not cited(answer, [d.n for d in documents])
    unsupported = unsupported_numbers(answer, [d.content for d in documents] + [d.title for d in documents]
                                      + conversation)
    return uncited, unsupported


def count(completed: ev.ResponseCompleted) -> None:
    """Count and log a flagged answer."""
    flags = [name for name, on in (("uncited", completed.uncited),
                                   ("unsupported_numbers", bool(completed.unsupported_numbers))) if on]
    if not flags:
        return
    FLAGGED.update(flags)
    log.warning("answer flagged by the citation audit", extra={
        "flags": flags, "unsupported_numbers": completed.unsupported_numbers, "backend": completed.backend,
        "session_id": completed.session_id, "turn": completed.turn, "flagged_total": dict(FLAGGED)})
