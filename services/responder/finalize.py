"""finalize: closes a turn with `TurnCompleted`, whose metadata the gateway sends to the
browser in the `complete` event."""

from __future__ import annotations

import msgspec

from shared import events as ev
from shared import awaiter, loader
from shared.config import env_float
from shared.consumer import Context, Node
from shared.state import ConversationState

NAME = "finalize"
ENRICHMENT_WAIT_S = env_float("FINALIZE_ENRICHMENT_WAIT_S", 0.5)


def metadata(state: ConversationState, completed: ev.ResponseCompleted) -> dict:
    record = state.turns.get(completed.turn)
    return {
        "route": record.route if record else None,
        "intent": record.intent if record else None,
        "fallback_used": completed.fallback_used,
        "visitor_profile": msgspec.to_builtins(state.visitor_profile),
        "response_node": completed.node,
    }


async def handle(event: ev.ResponseCompleted, ctx: Context) -> list[ev.Envelope]:
    # The visitor's company belongs in the metadata; enrichment is normally done by now.
    await awaiter.turn_event(ctx.bus, event.site, event.session_id, event.turn, "enrichment_completed",
                             timeout_s=ENRICHMENT_WAIT_S)
    state = await loader.load(ctx.bus, event.site, event.session_id)
    return [ctx.follow(ev.TurnCompleted, metadata=metadata(state, event))]


node = Node(name=NAME, consumes=("response_completed",), handle=handle)
