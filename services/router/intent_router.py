"""intent_router: decides where a turn goes (ANSWER / REDIRECT / BOOKING). Deterministic,
no LLM: it waits for this turn's IntentClassified, InterestSignalsDetected and
SkillsSelected (it consumes all three and acts on whichever arrives last) and applies the
routing table of routing.py.

Two handlers may both see the three events (they arrive close together); the decision's
event id derives from the turn's TurnRequested, so the bus stores it once.
"""

from __future__ import annotations

import msgspec

from services.router import routing
from services.router.runtime import RouterParts, visitor_message
from shared import events as ev
from shared import loader
from shared.consumer import Context, Node

NAME = "intent_router"
ANALYSES = ("intent_classified", "interest_signals_detected", "skills_selected")


def make_node(parts: RouterParts) -> Node:
    async def handle(event: ev.Envelope, ctx: Context) -> list[ev.Envelope]:
        state = await loader.load(ctx.bus, event.site, event.session_id)
        record = state.turns.get(event.turn)
        if record is None or not set(ANALYSES) <= set(record.seen) or "route_decided" in record.seen:
            return []
        if record.status != "requested":  # blocked, completed or failed: nothing to route
            return []
        config = await parts.configs.get(event.site)
        decision = routing.decide(
            intent=record.intent or "LEARN",
            message=visitor_message(state, event.turn),
            score=state.interest.score if state.interest.turn == event.turn else 0.0,
            threshold=config.interest.threshold,
            skills=record.skills_selected or [],
            booking=state.booking,
            confidence=record.intent_confidence if record.intent_confidence is not None else 1.0,
            runner_up=record.intent_runner_up or "",
            markers=tuple(record.intent_markers),
            strike_confidence=parts.classifier.strike_confidence,
        )
        decided = ctx.follow(ev.RouteDecided, key="route", route=decision.route, reason=decision.reason,
                             intent=decision.intent if record.intent else ev.UNKNOWN,
                             hack_increment=decision.hack_increment, suspicious=decision.suspicious,
                             branch=decision.branch)
        # One decision per turn whichever analysis arrived last: the id derives from the turn's
        # TurnRequested (the analyses' common cause), not from the event that woke us.
        turn_requested = event.causation_id or event.event_id
        return [msgspec.structs.replace(decided, causation_id=turn_requested,
                                        event_id=ev.derived_id(turn_requested, NAME, "route"))]

    return Node(name=NAME, consumes=ANALYSES, handle=handle)
