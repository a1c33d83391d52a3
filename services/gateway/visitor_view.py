"""What a visitor may see of their own conversation: what the widget shows, nothing else.

Never the prompts, the LLM calls, the site's config, IP hashes or what enrichment found
out about the visitor's company; those are for operators (operators.py). A whitelist, so
a field added to the turn's metadata later stays private until it is named here.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared import events as ev
from shared.state import ConversationState
from services.gateway.handoffs import transcript

PUBLIC_METADATA = (
    "route", "branch", "intent", "fallback_used", "blocked", "sources", "suggested_follow_ups",
    "suggested_answers", "form_values", "cta", "cta_url_overrides", "skill_selection_state",
    "booking", "dialog_flags", "handoff",
)


def public_metadata(metadata: dict | None) -> dict:
    return {key: metadata[key] for key in PUBLIC_METADATA if key in (metadata or {})}


def conversation(state: ConversationState, between: Sequence[ev.Envelope] = ()) -> dict:
    """The messages (answers with their sources and route: the widget offers a vote on an
    answer's; an operator's with their name, role "operator"; the site's notice when nobody
    could take a handoff, role "notice"), the handoff's standing (status
    "" | waiting | held, and who holds it) and the newest turn's widget state."""
    messages = []
    for item in transcript(state, between):
        if item["role"] == "assistant":
            record = state.turns.get(item["turn"])
            item["sources"] = (record.metadata.get("sources") or []) if record else []
            item["route"] = record.route if record else None
            item["rating"] = record.rating if record else ""  # the visitor's own vote, shown pressed again
        messages.append(item)
    completed = [t for t, record in state.turns.items() if record.status == "completed"]
    last = public_metadata(state.turns[max(completed)].metadata) if completed else {}
    return {"site": state.site, "session_id": state.session_id, "turn": state.turn, "messages": messages,
            "handoff": {"status": state.handoff.status, "operator": state.handoff.operator}, "last": last}
