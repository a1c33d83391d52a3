"""handoff_handler: replies to HANDOFF turns, with no model.

A turn that asks for a person (the router's VISITOR_ASKED, or LEAD_SCORE for a qualified
lead) stores `HandoffRequested` (why) and streams a localized waiting message
(data/replies.toml `handoff.waiting`): the conversation now waits for the site's team
(shared/state.py `HandoffState`), whose operators claim it and reply through the operator API.
A turn of a conversation already waiting for or held by a person (HELD) gets no answer at
all: an empty reply, so the turn closes (`complete`, route HANDOFF) and the visitor's message
waits for the operator in the log.
"""

from __future__ import annotations

from services.responder import replies
from services.responder.streaming import stream_text
from shared import events as ev
from shared import metrics
from shared.node import Context, Inputs, Needs, Node

NAME = "handoff_handler"
REASONS = {"VISITOR_ASKED": "visitor_asked", "LEAD_SCORE": "lead_score"}


async def hand_off(event: ev.RouteDecided, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    state, config = inputs.state, inputs.config
    if event.branch not in REASONS:  # HELD: the operator answers, not the AI
        return [ctx.follow(ev.ResponseCompleted, node=NAME, text="", token_count=0, attempt=ctx.attempt,
                           backend="template")]
    lang = replies.visitor_language(state, event.turn)
    waiting = replies.text("handoff.waiting", lang, site_name=config.name or event.site)
    metrics.handoffs.labels(REASONS[event.branch]).inc()
    return [ctx.follow(ev.HandoffRequested, reason=REASONS[event.branch], detail=event.reason),
            await stream_text(ctx, NAME, waiting)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("route_decided",), handle=hand_off,
                needs=Needs(state=True, config=True, when=lambda event: event.route == "HANDOFF"))
