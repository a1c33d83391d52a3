"""citations: what an answer cited, and whether its figures come from somewhere.

Checked on the server for every answer backend (the LLM may forget to cite, or write a
number no source holds), recorded on `ResponseCompleted` (`uncited`,
`unsupported_numbers`) and shown per source in the turn's metadata (`cited`). The audit
never blocks an answer: the text has already streamed; it is a flag to count and review.

- Citations: `[n]` (also `[1, 2]`, `[1][2]`) naming a document the answer was given.
- Numbers: the figures of shared/numbers.py ("$29", "99.95%", "5,000", "TLS 1.3", not
  citation markers nor list numbering), compared as normalized digits ("5,000" = "5000");
  an answer's number is supported when a source's text or the visitor's messages hold it.
"""

from __future__ import annotations

import logging
from collections import Counter

from shared import events as ev
# Re-exported under the names this module's callers know: the figures audit is one, shared
# with the lead briefs.
from shared.numbers import CITATION
from shared.numbers import figures as numbers
from shared.numbers import ungrounded as unsupported_numbers

log = logging.getLogger(__name__)

# Flagged answers since the process started, by flag: a log counter (see docs/operations.md).
FLAGGED: Counter[str] = Counter()


def cited(text: str, given: list[int] | None = None) -> list[int]:
    """The document numbers the text cites, in order of first citation; only those in
    `given` when it is passed."""
    found: list[int] = []
    for match in CITATION.finditer(text):
        for part in match.group(1).split(","):
            n = int(part)
            if n not in found and (given is None or n in given):
                found.append(n)
    return found


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
