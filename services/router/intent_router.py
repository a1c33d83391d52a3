"""intent_router: decides where a turn goes (ANSWER / REDIRECT / BOOKING). Deterministic,
no LLM: it joins this turn's IntentClassified, InterestSignalsDetected and SkillsSelected
(`Needs.join`: the runner hands it the one the log stored last, once all three are in) and
applies the routing table of routing.py, so a turn's route is decided and published once,
not up to three times. Should two decide anyway (a rewritten log), the decision is caused by
the turn's TurnRequested (the analyses' common cause), not by the event that woke the node,
so its id is the same either way and the bus stores it once.
"""

from __future__ import annotations

from services.router import routing
from services.router.runtime import RouterParts
from shared import events as ev
from shared import history
from shared.node import Context, Inputs, Needs, Node

NAME = "intent_router"
ANALYSES = ("intent_classified", "interest_signals_detected", "skills_selected")


def make_node(parts: RouterParts) -> Node:
    async def route(event: ev.Envelope, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state, config = inputs.state, inputs.config
        record = state.turns[event.turn]
        if "route_decided" in record.seen:
            return []
        if record.status != "requested":  # blocked, completed or failed: nothing to route
            return []
        decision = routing.decide(
            intent=record.intent or "LEARN",
            message=history.message_of(state, event.turn),
            score=state.interest.score if state.interest.turn == event.turn else 0.0,
            threshold=config.interest.threshold,
            skills=record.skills_selected or [],
            booking=state.booking,
            confidence=record.intent_confidence if record.intent_confidence is not None else 1.0,
            runner_up=record.intent_runner_up or "",
            markers=tuple(record.intent_markers),
            strike_confidence=parts.classifier.strike_confidence,
        )
        return [ctx.follow(ev.RouteDecided, key="route", cause_id=event.causation_id or event.event_id,
                           route=decision.route, reason=decision.reason,
                           intent=decision.intent if record.intent else ev.UNKNOWN,
                           hack_increment=decision.hack_increment, suspicious=decision.suspicious,
                           branch=decision.branch)]

    return Node(name=NAME, consumes=ANALYSES, handle=route, needs=Needs(state=True, config=True, join=ANALYSES))
