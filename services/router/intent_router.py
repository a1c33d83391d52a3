"""intent_router: decides where a turn goes (ANSWER / REDIRECT / BOOKING).

Walking-skeleton rule: every turn is answered. The classifier, signal and skill nodes
(issue #3) will feed this node; until then there is nothing to route on.
"""

from __future__ import annotations

from shared import events as ev
from shared.consumer import Context, Node

NAME = "intent_router"


def decide(event: ev.TurnRequested) -> tuple[str, str]:
    return "ANSWER", "no classifier deployed yet: every turn is answered"


async def handle(event: ev.TurnRequested, ctx: Context) -> list[ev.Envelope]:
    route, reason = decide(event)
    return [ctx.follow(ev.RouteDecided, route=route, reason=reason)]


node = Node(name=NAME, consumes=("turn_requested",), handle=handle)
