"""suggestion_router: which suggestions go under a reply → `SuggestionsRouted`: answer
options when the reply ends by asking the visitor something, follow-up questions
otherwise; an empty reply gets none (`SuggestionsGenerated(kind="none")`, so the turn
still closes)."""

from __future__ import annotations

from services.responder.reply_markers import ends_with_question
from shared import events as ev
from shared.node import Context, Inputs, Node

NAME = "suggestion_router"


async def route_suggestions(event: ev.ResponseCompleted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    if not event.text.strip():
        return [ctx.follow(ev.SuggestionsGenerated, kind="none")]
    kind = "answers" if ends_with_question(event.text) else "follow_up"
    return [ctx.follow(ev.SuggestionsRouted, kind=kind)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("response_completed",), handle=route_suggestions)
