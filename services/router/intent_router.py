"""intent_router: decides where a turn goes (ANSWER / REDIRECT / BOOKING), and the skills the
reply applies. Deterministic, no LLM: it joins this turn's analyses (`Needs.join`: the runner
hands it the one the log stored last, once all are in): IntentClassified and
InterestSignalsDetected, and with `ROUTER_SKILLS_BACKEND=llm` the skill selector's
SkillsSelected too. Then, from the joined state:

1. the skills the turn calls for, by the local selection rules (skills.select) on the intent,
   this turn's signals and the cumulative score → `SkillsSelected` (local backend; the LLM
   backend's selection is the one joined);
2. the route, by the routing table of routing.py → `RouteDecided`;
3. the skills the reply applies, the selection with the deterministic rules of skills.apply
   (demo forcing, e-mail known, CTA timing, post-conversion) → `SkillsApplied`.

All three are pure functions of what the join holds, so they are made where the join is, in
one handling, not by nodes a hop apart: `SkillsApplied` is stored before `RouteDecided`, so
the reply handlers woken by the route find it in the log, without waiting. A turn's events
are made once, not once per analysis. Should two handlings decide anyway (a rewritten log),
the outputs are caused by the turn's TurnRequested (the analyses' common cause), not by the
event that woke the node, so their ids are the same either way and the bus stores them once.
"""

from __future__ import annotations

from services.router import routing
from services.router.handoff import unanswered
from services.router.runtime import RouterParts
from shared import events as ev
from shared import history
from shared import skills as sk
from shared.node import Context, Inputs, Needs, Node

NAME = "intent_router"
ANALYSES = ("intent_classified", "interest_signals_detected")


def make_node(parts: RouterParts) -> Node:
    selects = parts.skills_backend != "llm"  # else the skill selector's SkillsSelected is joined
    joined = ANALYSES if selects else (*ANALYSES, "skills_selected")

    async def route(event: ev.Envelope, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state, config = inputs.state, inputs.config
        record = state.turns[event.turn]
        if "route_decided" in record.seen:
            return []
        if record.status != "requested":  # blocked, completed or failed: nothing to route
            return []
        cause = event.causation_id or event.event_id
        out: list[ev.Envelope] = []
        selected = record.skills_selected or []
        if selects:
            intent = record.intent or "LEARN"
            signals = state.interest.signals if state.interest.turn == event.turn else {}
            selected = sk.select(intent, signals, state.interest.score, state, config)
            out.append(ctx.follow(ev.SkillsSelected, cause_id=cause, skills=selected, classifier="local",
                                  intent=intent))
        decision = routing.decide(
            intent=record.intent or "LEARN",
            message=history.message_of(state, event.turn),
            score=state.interest.score if state.interest.turn == event.turn else 0.0,
            threshold=config.interest.threshold,
            skills=selected,
            booking=state.booking,
            confidence=record.intent_confidence if record.intent_confidence is not None else 1.0,
            runner_up=record.intent_runner_up or "",
            markers=tuple(record.intent_markers),
            strike_confidence=parts.classifier.strike_confidence,
            handoff=routing.HandoffRules(status=state.handoff.status, operator=state.handoff.operator,
                                         enabled=config.handoff.enabled, lead_score=config.handoff.lead_score,
                                         handoffs=state.handoff.handoffs, follow_up=state.handoff.follow_up,
                                         not_found_turns=config.handoff.not_found_turns,
                                         unanswered=unanswered(state) if config.handoff.not_found_turns else 0),
        )
        decided = ctx.follow(ev.RouteDecided, key="route", cause_id=cause,
                             route=decision.route, reason=decision.reason,
                             intent=decision.intent if record.intent else ev.UNKNOWN,
                             hack_increment=decision.hack_increment, suspicious=decision.suspicious,
                             branch=decision.branch)
        applied, rules, question = sk.apply_for_turn(state, decided, config, selected=selected)
        out.append(ctx.follow(ev.SkillsApplied, cause_id=cause, skills=applied, rules=rules,
                              qualification_question=question))
        return [*out, decided]

    return Node(name=NAME, consumes=joined, handle=route, needs=Needs(state=True, config=True, join=joined))
