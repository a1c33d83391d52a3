"""How a brief step's give-up is recorded: a `BriefFailed` in the lead's log (or the site's
triage log), never a `TurnFailed` (no visitor's turn is waiting on a brief), and counted."""

from __future__ import annotations

from shared import events as ev
from shared import metrics


def brief_failed(event: ev.Envelope, node: str, attempts: int, reason: str, backend: str = "") -> ev.BriefFailed:
    metrics.briefs.labels("failed", backend or "unknown").inc()
    return ev.follow(event, ev.BriefFailed, node, key="failed", node=node, reason=reason[:2000], attempts=attempts,
                     request_id=getattr(event, "request_id", ""), failed_event_id=event.event_id)
