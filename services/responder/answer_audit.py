"""answer_audit: the server's audit of every answer, whatever wrote it (the LLM may forget to
cite, or write a number no source holds), by the rule of shared/citations.py. Recorded on
`ResponseCompleted` (`uncited`, `unsupported_numbers`) and shown per source in the turn's
metadata (`cited`, finalize). The audit never blocks an answer: the text has already
streamed; it is a flag to count and review.
"""

from __future__ import annotations

import logging
from collections import Counter

from shared import citations
from shared import events as ev
from shared.site_config import SiteConfig

log = logging.getLogger(__name__)

# Flagged answers since the process started, by flag: a log counter (see docs/operations.md).
FLAGGED: Counter[str] = Counter()


def site_words(config: SiteConfig, question: str | None) -> list[str]:
    """What the site wrote that a reply repeats: its CTA's label (when it has a link, as the
    `complete` metadata's `cta`), the qualifying question asked."""
    has_cta = bool(config.cta.booking_url or config.cta.url)
    return [*([config.cta.label] if has_cta else []), *([question] if question else [])]


def audit(answer: str, documents: list[ev.RetrievedDocument], references: list[str], *,
          declined: bool = False) -> tuple[bool, list[str]]:
    """(uncited, unsupported numbers) of an answer given `documents` to cite, its figures
    checked against the documents and `references` (the visitor's messages, `site_words`).
    An answer that declined (said it found nothing) claims nothing, so needs no citation."""
    uncited = bool(documents) and not declined and not citations.cited(answer, [d.n for d in documents])
    texts = [text for d in documents for text in (d.title, d.content)] + references
    return uncited, citations.unsupported(answer, texts)


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
