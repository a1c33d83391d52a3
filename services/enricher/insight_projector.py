"""insight_projector: each conversation's insight record (shared/insight.py) kept current.

Consumes the events that end a turn or change a vote (`insight.TRIGGERS`), reads the
conversation's events of `insight.KINDS` (declared `Needs.log`, read at least up to the
event) and stores the record they make in the `insight` bucket, unless one made from more of
the log is there already. The record is a function of the log alone, so a redelivered event
or two replicas racing store the same record, and `concierge insight rebuild` makes the same
records again. No event out; what it gives up on is a `ProjectionFailed` in the conversation.
Per-site counters (shared/metrics.py `insight_*`) count what a stored record adds to the
one it replaced.
"""

from __future__ import annotations

from shared import events as ev
from shared import insight, metrics
from shared.node import Context, Inputs, Needs, Node

NAME = "insight_projector"


def make_node(projections: insight.Projections) -> Node:
    async def project(event: ev.Envelope, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        record = insight.conversation_facts(event.site, event.session_id, inputs.log)
        stored, replaced = await projections.save(record)
        if stored:
            count(record, replaced)
        return []

    return Node(NAME, consumes=insight.TRIGGERS, handle=project, failure=projection_failed,
                needs=Needs(log=insight.KINDS, when=lambda event: ev.is_conversation(event.session_id)))


def count(record: insight.ConversationFacts, replaced: insight.ConversationFacts | None) -> None:
    """What `record` adds to `replaced` (None: the first record of the conversation)."""
    before = {t.turn: t for t in (replaced.turns if replaced else [])}
    for turn in record.turns:
        old = before.get(turn.turn)
        if turn.outcome != "pending" and (old is None or old.outcome == "pending"):
            metrics.insight_turns.labels(metrics.site_label(record.site), turn.outcome).inc()
        if turn.rating and (old is None or old.rating != turn.rating):
            metrics.insight_feedback.labels(metrics.site_label(record.site), turn.rating).inc()
    if replaced is None or replaced.outcome != record.outcome:
        metrics.insight_conversations.labels(metrics.site_label(record.site), record.outcome).inc()


def projection_failed(event: ev.Envelope, node: str, attempts: int, reason: str) -> ev.Envelope:
    return ev.follow(event, ev.ProjectionFailed, node, key="projection-failed", node=node, reason=reason[:2000],
                     attempts=attempts, failed_event_id=event.event_id)
