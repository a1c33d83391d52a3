"""finalize: closes a turn with `TurnCompleted`, whose metadata the gateway sends to the
browser in the `complete` event.

It runs on the turn's `SuggestionsGenerated` (the last step after a reply) and gathers,
each with a short bounded wait, the turn's dialog state, form fields and enrichment, so
a slow or missing one delays the close a little and never blocks it.
"""

from __future__ import annotations

import msgspec

from shared import awaiter, events as ev
from shared.config import env_float
from shared.consumer import Context, Node
from shared.state import ConversationState

NAME = "finalize"
WAIT_S = env_float("FINALIZE_WAIT_S", 0.5)
GATHERED = ("dialog_state_extracted", "form_fields_extracted", "enrichment_completed")


def metadata(state: ConversationState, turn: int, suggestions: ev.SuggestionsGenerated) -> dict:
    record = state.turns.get(turn)
    return {
        "route": record.route if record else None,
        "intent": record.intent if record else None,
        "fallback_used": bool(record and record.fallback_used),
        "visitor_profile": msgspec.to_builtins(state.visitor_profile),
        "suggested_follow_ups": suggestions.suggestions if suggestions.kind == "follow_up" else [],
        "suggested_answers": suggestions.suggestions if suggestions.kind == "answers" else [],
        "form_values": dict(state.form.values),
        # Booking URLs come with site configuration (issue #3); until then there is nothing to override.
        "cta_url_overrides": {},
        "dialog_flags": dict(state.dialog.latest) if state.dialog.latest_turn == turn else {},
    }


async def handle(event: ev.SuggestionsGenerated, ctx: Context) -> list[ev.Envelope]:
    state = await awaiter.turn_state(ctx.bus, event.site, event.session_id, event.turn, set(GATHERED), WAIT_S)
    return [ctx.follow(ev.TurnCompleted, metadata=metadata(state, event.turn, event))]


node = Node(name=NAME, consumes=("suggestions_generated",), handle=handle)
