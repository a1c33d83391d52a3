"""Response-ending skills: which ones a turn calls for (selection) and the deterministic
rules that turn the selection into what the handler applies (application).

The router's intent_router runs both where it joins the turn's analyses, and records them
as `SkillsSelected` and `SkillsApplied` next to its `RouteDecided`.

Skills: propose_demo, collect_email, ask_qualifying_question, suggest_follow_up,
share_resource; `none` when no skill applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shared.site_config import SiteConfig
from shared.state import ConversationState

if TYPE_CHECKING:
    from shared.events import RouteDecided

NONE = "none"
CTA = ("propose_demo", "collect_email")


def email_known(state: ConversationState) -> bool:
    return (state.booking.lead_captured or "email" in state.form.values or "email" in state.booking.collected
            or state.visitor_profile.email not in ("", "unknown"))


def _ordered(skills: set[str]) -> list[str]:
    order = ("propose_demo", "collect_email", "ask_qualifying_question", "share_resource", "suggest_follow_up")
    chosen = [s for s in order if s in skills]
    return chosen or [NONE]


def select(intent: str, signals: dict[str, bool], score: float, state: ConversationState,
           config: SiteConfig) -> list[str]:
    """The local selector: from the intent, this turn's signals, the cumulative score and
    what the conversation already holds."""
    skills: set[str] = set()
    interested = score >= config.interest.threshold
    if intent in ("HACK", "OFFTOPIC", "STOP_BOOKING"):
        pass  # end plainly
    elif intent == "BOOKING" or signals.get("demo_interest"):
        skills |= {"propose_demo", "collect_email"}
    elif intent in ("LEARN", "CONTEXT"):
        skills.add("suggest_follow_up")
        if intent == "CONTEXT":
            skills.add("ask_qualifying_question")
        if interested:
            skills.add("propose_demo")
            if signals.get("pricing_interest") or signals.get("timeline"):
                skills.add("collect_email")
    elif intent in ("SUPPORT", "OTHER"):
        skills.add("share_resource")
    if email_known(state):
        skills.discard("collect_email")
    enabled = set(config.skills.enabled)
    return _ordered({s for s in skills if s in enabled})


def apply(selected: list[str], *, intent: str, route: str, branch: str, turn: int, signals: dict[str, bool],
          state: ConversationState, config: SiteConfig) -> tuple[list[str], list[str], str | None]:
    """The applied skills, the rules that changed them (in order), and the qualification
    question to ask now (post-conversion). Rules:

    1. demo_forcing: a booking intent or route (or this turn's demo interest) forces
       propose_demo;
    2. email_known: no collect_email once the e-mail is known;
    3. cta_too_early / cta_cooldown: no unsolicited propose_demo / collect_email before
       `cta.first_turn` or within `cta.cooldown_turns` of the last ask — unless forced by
       rule 1 or by this turn's own timeline signal (current-turn signal override);
    4. post_conversion: after a captured lead, no demo or e-mail asks; the next unasked
       qualification question of the site instead;
    5. not_enabled: skills the site disabled are dropped;
    6. no_skills_on_redirect_hack / stop_booking: HACK and STOP_BOOKING end plainly.
    """
    skills = set(s for s in selected if s != NONE)
    rules: list[str] = []
    question: str | None = None

    forced = (intent == "BOOKING" or branch == "INTEREST_THRESHOLD"
              or route == "BOOKING" and branch in ("DEMO_REQUESTED", "STAY"))
    forced = forced or bool(signals.get("demo_interest"))
    if forced and "propose_demo" not in skills and not state.booking.lead_captured:
        skills.add("propose_demo")
        rules.append("demo_forcing")
    if "collect_email" in skills and email_known(state):
        skills.discard("collect_email")
        rules.append("email_known")
    override = forced or bool(signals.get("timeline"))
    # This turn's own SkillsApplied may already be folded in (answer_writer recomputing it):
    # only earlier turns count for the cooldown. If it asked, the rules allowed it, so the
    # earlier ask was outside the cooldown either way.
    last_cta = state.last_cta_turn if state.last_cta_turn < turn else 0
    if skills & set(CTA) and not override:
        if turn < config.cta.first_turn:
            skills -= set(CTA)
            rules.append("cta_too_early")
        elif last_cta and turn - last_cta <= config.cta.cooldown_turns:
            skills -= set(CTA)
            rules.append("cta_cooldown")
    elif skills & set(CTA) and override and (turn < config.cta.first_turn or (
            last_cta and turn - last_cta <= config.cta.cooldown_turns)):
        rules.append("signal_override")
    if state.booking.lead_captured and not state.booking.active:
        if skills & set(CTA):
            skills -= set(CTA)
            rules.append("post_conversion")
        remaining = [q for q in config.qualification.questions if q not in state.qualification_asked]
        if remaining and route != "REDIRECT":
            question = remaining[0]
            skills.add("ask_qualifying_question")
            if "post_conversion" not in rules:
                rules.append("post_conversion")
    if intent in ("HACK", "STOP_BOOKING") and skills:
        skills.clear()
        rules.append("hack" if intent == "HACK" else "stop_booking")
    enabled = set(config.skills.enabled)
    if skills - enabled:
        skills &= enabled
        rules.append("not_enabled")
    if question and "ask_qualifying_question" not in skills:
        question = None
    return _ordered(skills), rules, question


def apply_for_turn(state: ConversationState, route: "RouteDecided", config: SiteConfig,
                   selected: list[str] | None = None) -> tuple[list[str], list[str], str | None]:
    """`apply` with its inputs taken from the conversation state at this turn's route
    (`selected`: the turn's selection when the state does not hold it yet). Reads only what
    precedes the route (the analyses and earlier turns), so it gives the same result
    whenever it runs after the route is decided."""
    record = state.turns.get(route.turn)
    signals = state.interest.signals if state.interest.turn == route.turn else {}
    asked = [q for q in state.qualification_asked if not record or q != record.qualification_question]
    before = msgspec.structs.replace(state, qualification_asked=asked) if asked != state.qualification_asked else state
    if not state.booking.active and state.booking.ended_turn == route.turn:
        # This turn's own booking step (after its route) ended the flow: as of the route, the
        # booking was still going, whether or not the handler has stored its step yet.
        before = msgspec.structs.replace(before, booking=msgspec.structs.replace(state.booking, active=True))
    if selected is None:
        selected = (record.skills_selected if record else None) or []
    return apply(selected, intent=route.intent, route=route.route,
                 branch=route.branch, turn=route.turn, signals=signals, state=before, config=config)
