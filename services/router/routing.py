"""The routing table: given what this turn's analysis found and where the conversation
stands, where does the turn go? Pure and deterministic; the rules, in order:

| # | when                                                       | route    | branch             |
|---|------------------------------------------------------------|----------|--------------------|
| 0 | intent HACK with confidence ≥ the strike confidence (ROUTER_HACK_STRIKE_CONFIDENCE, 0.8; a decisive injection marker gives 1.0), or corroborated by an injection cue: a strike, the gateway blocks at 2 | REDIRECT | EXIT mid-booking, REDIRECT_HACK otherwise |
| H | the conversation waits for or is held by a person of the team (`HandoffState`): the AI does not answer | HANDOFF | HELD |
| F | nobody could take the last handoff, the visitor was asked for an e-mail address and the message has one | HANDOFF | EMAIL_LEFT |
| P | the site takes handoffs (`[handoff] enabled`) and the visitor asks for a person (handoff.py), mid-booking too | HANDOFF | VISITOR_ASKED |
| 1 | any other HACK: suspicious, no strike; routed by rules 2-12 as its runner-up intent (LEARN when unknown) with the HACK's confidence (so "ada@example" while the e-mail is asked stays in the flow, rule 4) | by rules 2-12 | by rules 2-12 |
| 2 | STOP_BOOKING with a booking flow under way                  | BOOKING  | STOP (the flow ends politely) |
| 3 | STOP_BOOKING with no flow                                   | ANSWER   | NOTHING_TO_STOP    |
| 4 | flow under way and the message answers the field: an e-mail (even a malformed one when the e-mail was asked), BOOKING / CONTEXT, or a short statement the classifier is unsure of | BOOKING | STAY |
| 5 | flow under way, LEARN (a product question)                  | ANSWER   | PAUSE (the flow stays open) |
| 6 | flow under way, SUPPORT / OFFTOPIC / OTHER                  | REDIRECT | EXIT (the flow ends) |
| Q | no flow under way, LEARN / CONTEXT / BOOKING, the site takes handoffs with a `lead_score` and the cumulative score reaches it, no handoff yet in the conversation | HANDOFF | LEAD_SCORE |
| N | no flow under way, LEARN / CONTEXT, the site takes handoffs with `not_found_turns` and that many answers in a row found nothing or were rated down (handoff.py `unanswered`) | HANDOFF | NOT_FOUND |
| 7 | lead captured (flow over), LEARN / CONTEXT / BOOKING         | ANSWER   | POST_CONVERSION    |
| 8 | intent BOOKING                                              | BOOKING  | DEMO_REQUESTED     |
| 9 | LEARN / CONTEXT, cumulative score ≥ site threshold and the skills propose a demo: answered first, the demo offer ends it (the booking flow starts on a BOOKING intent or the offer accepted) | ANSWER | INTEREST_THRESHOLD |
| 10| LEARN / CONTEXT                                             | ANSWER   | DEFAULT            |
| 11| SUPPORT / OTHER: answered from the site's knowledge when it holds the answer (a vendor's help pages are its knowledge); with nothing found, the reply names the site's contact for it (support page, careers, press…) | ANSWER | ANSWER_<INTENT> |
| 12| OFFTOPIC (one under 0.6 confidence whose runner-up is LEARN / CONTEXT / SUPPORT / OTHER: routed as that) | REDIRECT | REDIRECT_OFFTOPIC |
"""

from __future__ import annotations

import msgspec

from services.router.handoff import asks_for_person
from shared.privacy import EMAIL_RE
from shared.state import BookingState


class Decision(msgspec.Struct, kw_only=True, frozen=True):
    route: str
    branch: str
    reason: str
    hack_increment: int = 0
    intent: str = ""  # the intent the turn was routed as (a suspicious HACK: its runner-up)
    suspicious: bool = False  # a HACK too unsure to strike, routed as its runner-up


SHORT_ANSWER_WORDS = 8
UNSURE = 0.6
STRIKE_CONFIDENCE = 0.8  # ROUTER_HACK_STRIKE_CONFIDENCE; see docs/benchmarks-history.md (HACK precision: the threshold swept)
# A support request or a jobs / press / partners question may well be answered by the site's
# own pages (billing, roles, careers): the answer says where to go when they hold nothing.
ANSWERED_FROM_KNOWLEDGE = ("SUPPORT", "OTHER")
ANSWERABLE_RUNNERS_UP = ("LEARN", "CONTEXT", "SUPPORT", "OTHER")  # what an unsure OFFTOPIC is routed as
ROUTABLE = ("LEARN", "CONTEXT", "SUPPORT", "OFFTOPIC", "OTHER", "BOOKING", "STOP_BOOKING")


def answers_field(intent: str, confidence: float, message: str, booking: BookingState) -> bool:
    if EMAIL_RE.search(message) or intent in ("BOOKING", "CONTEXT"):
        return True
    if booking.pending_field == "email" and "@" in message:
        return True  # a malformed address: the booking handler asks again
    short = len(message.split()) <= SHORT_ANSWER_WORDS and "?" not in message
    return bool(booking.pending_field) and short and confidence < UNSURE  # "Acme Corp", "11-50"


class HandoffRules(msgspec.Struct, kw_only=True, frozen=True):
    """The conversation's handoff (its `HandoffState`) and the site's rules for one."""

    status: str = ""  # "" | waiting | held
    operator: str = ""
    enabled: bool = False
    lead_score: float = 0.0  # 0: never on the score
    handoffs: int = 0  # requested so far in the conversation
    follow_up: bool = False  # nobody could take the last one: the visitor was asked for an e-mail address
    not_found_turns: int = 0  # the site's rule N (0: never)
    unanswered: int = 0  # answers in a row that found nothing or were rated down (handoff.py)


def decide(*, intent: str, message: str, score: float, threshold: float, skills: list[str],
           booking: BookingState, confidence: float = 1.0, runner_up: str = "", markers: tuple[str, ...] = (),
           strike_confidence: float = STRIKE_CONFIDENCE, handoff: HandoffRules = HandoffRules()) -> Decision:
    """`markers`: the injection markers and cues the classifier found (IntentClassified.markers)."""
    if intent == "HACK" and (confidence >= strike_confidence or markers):
        active = booking.active
        return Decision(route="REDIRECT", branch="EXIT" if active else "REDIRECT_HACK", hack_increment=1, intent=intent,
                        reason="prompt-injection or data-extraction attempt" + (", booking flow left" if active else ""))
    if handoff.status in ("waiting", "held"):
        who = f"{handoff.operator} holds the conversation" if handoff.status == "held" else "waiting for the team"
        return Decision(route="HANDOFF", branch="HELD", intent=intent, reason=f"{who}: the message goes to them")
    if handoff.follow_up and EMAIL_RE.search(message):
        return Decision(route="HANDOFF", branch="EMAIL_LEFT", intent=intent,
                        reason="the visitor left an e-mail address for the team, who could not take the conversation")
    if handoff.enabled and asks_for_person(message):
        return Decision(route="HANDOFF", branch="VISITOR_ASKED", intent=intent, reason="the visitor asked for a person")
    if intent == "HACK":
        # Two strikes block the session for good: an unsure HACK is answered as what it most
        # likely is otherwise, and the event says it was suspicious.
        routed = runner_up if runner_up in ROUTABLE else "LEARN"
        decision = _route(routed, message, score, threshold, skills, booking, confidence, handoff)
        return msgspec.structs.replace(
            decision, intent=routed, suspicious=True,
            reason=f"suspicious: HACK {confidence:.2f} < strike confidence {strike_confidence:.2f} and no injection cue, "
                   f"no strike; "
                   f"routed as {routed}: {decision.reason}")
    if intent == "OFFTOPIC" and confidence < UNSURE and runner_up in ANSWERABLE_RUNNERS_UP:
        # "Y a-t-il un essai gratuit ?" read as off-topic at 0.49, a product question at 0.36:
        # a product question refused costs more than an off-topic one answered "not found".
        decision = _route(runner_up, message, score, threshold, skills, booking, confidence, handoff)
        return msgspec.structs.replace(decision, intent=runner_up,
                                       reason=f"unsure OFFTOPIC ({confidence:.2f} < {UNSURE}): routed as {runner_up}: "
                                              f"{decision.reason}")
    return msgspec.structs.replace(_route(intent, message, score, threshold, skills, booking, confidence, handoff),
                                   intent=intent)


def _route(intent: str, message: str, score: float, threshold: float, skills: list[str], booking: BookingState,
           confidence: float, handoff: HandoffRules) -> Decision:
    """Rules 2-12 (Q and N among them), for every intent but a striking HACK."""
    active = booking.active
    if intent == "STOP_BOOKING":
        if active:
            return Decision(route="BOOKING", branch="STOP", reason="the visitor wants out of the booking flow")
        return Decision(route="ANSWER", branch="NOTHING_TO_STOP", reason="STOP_BOOKING with no booking flow under way")
    if active:
        if answers_field(intent, confidence, message, booking):
            field = booking.pending_field or "the booking"
            return Decision(route="BOOKING", branch="STAY", reason=f"answering the active booking field: {field}")
        if intent == "LEARN":
            return Decision(route="ANSWER", branch="PAUSE", reason="product question mid-booking: answered, flow kept")
        return Decision(route="REDIRECT", branch="EXIT", reason=f"{intent} mid-booking: the flow ends")
    if (handoff.enabled and handoff.lead_score > 0 and score >= handoff.lead_score and not handoff.handoffs
            and intent in ("LEARN", "CONTEXT", "BOOKING")):
        return Decision(route="HANDOFF", branch="LEAD_SCORE",
                        reason=f"a qualified lead: interest score {score:.2f} ≥ {handoff.lead_score:.2f}")
    if (handoff.enabled and handoff.not_found_turns > 0 and handoff.unanswered >= handoff.not_found_turns
            and intent in ("LEARN", "CONTEXT")):
        return Decision(route="HANDOFF", branch="NOT_FOUND",
                        reason=f"{handoff.unanswered} answers in a row found nothing or were rated down "
                               f"(the site hands off at {handoff.not_found_turns})")
    if booking.lead_captured and intent in ("LEARN", "CONTEXT", "BOOKING"):
        return Decision(route="ANSWER", branch="POST_CONVERSION", reason="lead already captured: qualification, not booking")
    if intent == "BOOKING":
        return Decision(route="BOOKING", branch="DEMO_REQUESTED", reason="the visitor asked for a demo or a call")
    if intent in ("LEARN", "CONTEXT"):
        if score >= threshold and "propose_demo" in skills:
            return Decision(route="ANSWER", branch="INTEREST_THRESHOLD",
                            reason=f"interest score {score:.2f} ≥ {threshold:.2f} and skills propose a demo: "
                                   f"answered, the demo offered at its end")
        return Decision(route="ANSWER", branch="DEFAULT", reason=f"{intent}: answered from the knowledge base")
    if intent in ANSWERED_FROM_KNOWLEDGE:
        return Decision(route="ANSWER", branch=f"ANSWER_{intent}",
                        reason=f"{intent}: answered from the site's knowledge, its contact named when nothing is found")
    return Decision(route="REDIRECT", branch=f"REDIRECT_{intent}", reason=f"{intent}: redirected")
