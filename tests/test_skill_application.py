"""Skill application, given-when-then: given the conversation so far (the turn's selected
skills and signals, earlier asks, what is known of the visitor, the captured lead) and the
site's config, when the turn is routed, then the skills the reply applies: the selection with
the rules applied, read from the state (skills.apply_for_turn, which the intent router runs
at its join and records as SkillsApplied). The rules alone (skills.apply): test_router.py."""

from __future__ import annotations

import pytest

from shared import events as ev
from shared import skills as sk
from shared.events import VisitorProfile
from shared.site_config import CTA, Qualification, SiteConfig, Skills
from tests.helpers import state_of, turn

SESSION = "a1"


def asked(number: int, skills=("propose_demo",), question: str | None = None) -> list[ev.Envelope]:
    """An earlier turn, answered, whose applied skills were `skills` (and `question`)."""
    request = turn("s", SESSION, number, f"message {number}")
    return [request,
            ev.follow(request, ev.RouteDecided, "intent_router", route="ANSWER", reason="t", intent="LEARN",
                      branch="DEFAULT"),
            ev.follow(request, ev.SkillsApplied, "intent_router", skills=list(skills), qualification_question=question)]


def routed(number: int, selected, *, intent="LEARN", route="ANSWER", branch="DEFAULT", signals=None):
    """Turn `number` with its selection and signals stored, and the RouteDecided that wakes the node."""
    request = turn("s", SESSION, number, f"message {number}")
    given = [request,
             ev.follow(request, ev.InterestSignalsDetected, "interest_signals_detector", signals=signals or {}),
             ev.follow(request, ev.SkillsSelected, "skill_selector", skills=list(selected))]
    decision = ev.follow(request, ev.RouteDecided, "intent_router", route=route, reason="t", intent=intent,
                         branch=branch)
    return given, decision


def applied_in(config: SiteConfig, *events: ev.Envelope) -> tuple[list[str], list[str], str | None]:
    """(skills, rules, question) at the turn's route, the last RouteDecided of `events`."""
    decision = [e for e in events if isinstance(e, ev.RouteDecided)][-1]
    return sk.apply_for_turn(state_of(*events), decision, config)


async def apply(number: int, selected, *history, config=None, **route) -> ev.SkillsApplied:
    given, decision = routed(number, selected, **route)
    skills, rules, question = sk.apply_for_turn(state_of(*history, *given), decision, config or SiteConfig())
    return ev.follow(decision, ev.SkillsApplied, "intent_router", skills=skills, rules=rules,
                     qualification_question=question)


async def test_a_demo_request_forces_the_demo_proposal():
    applied = await apply(3, ["suggest_follow_up"], intent="BOOKING", route="BOOKING", branch="DEMO_REQUESTED")
    assert applied.skills == ["propose_demo", "suggest_follow_up"] and applied.rules == ["demo_forcing"]


async def test_an_ordinary_selection_goes_through_unchanged():
    applied = await apply(3, ["propose_demo", "collect_email", "suggest_follow_up"])
    assert applied.skills == ["propose_demo", "collect_email", "suggest_follow_up"] and applied.rules == []


def form(number=1):
    request = turn("s", SESSION, number, "I'm ada@example.com")
    return [request, ev.follow(request, ev.FormFieldsExtracted, "form_field_extractor",
                               values={"email": "ada@example.com"})]


def booking(number=1):
    request = turn("s", SESSION, number, "ada@example.com")
    return [request, ev.follow(request, ev.BookingProgressed, "booking_handler", pending_field="company",
                               collected={"email": "ada@example.com"})]


def profile(number=1):
    request = turn("s", SESSION, number, "Hello")
    return [request, ev.follow(request, ev.EnrichmentCompleted, "enrichment",
                               profile=VisitorProfile(email="ada@example.com"))]


@pytest.mark.parametrize("known", [form, booking, profile], ids=["form", "booking_flow", "visitor_profile"])
async def test_no_email_is_asked_once_the_conversation_knows_it(known):
    applied = await apply(3, ["propose_demo", "collect_email"], *known(), intent="BOOKING", route="BOOKING",
                          branch="DEMO_REQUESTED")
    assert applied.skills == ["propose_demo"] and applied.rules == ["email_known"]


async def test_no_unsolicited_ask_before_the_sites_first_turn():
    config = SiteConfig(cta=CTA(first_turn=3, cooldown_turns=2))
    early = await apply(2, ["propose_demo", "suggest_follow_up"], *asked(1, ["suggest_follow_up"]), config=config)
    assert early.skills == ["suggest_follow_up"] and early.rules == ["cta_too_early"]
    on_time = await apply(3, ["propose_demo", "suggest_follow_up"], *asked(1, ["suggest_follow_up"]), config=config)
    assert on_time.skills == ["propose_demo", "suggest_follow_up"] and on_time.rules == []


async def test_no_unsolicited_ask_within_the_cooldown_of_the_last_one():
    """The last ask is read from the earlier turn's SkillsApplied."""
    config = SiteConfig(cta=CTA(first_turn=2, cooldown_turns=2))
    soon = await apply(5, ["propose_demo"], *asked(4), config=config)
    assert soon.skills == ["none"] and soon.rules == ["cta_cooldown"]
    later = await apply(7, ["propose_demo"], *asked(4), config=config)
    assert later.skills == ["propose_demo"] and later.rules == []
    no_ask_before = await apply(5, ["propose_demo"], *asked(4, ["suggest_follow_up"]), config=config)
    assert no_ask_before.skills == ["propose_demo"] and no_ask_before.rules == []


async def test_this_turns_timeline_overrides_the_timing():
    config = SiteConfig(cta=CTA(first_turn=3, cooldown_turns=2))
    applied = await apply(1, ["propose_demo"], config=config, signals={"timeline": True})
    assert applied.skills == ["propose_demo"] and applied.rules == ["signal_override"]


async def test_after_the_lead_the_next_qualification_question_instead_of_asks():
    config = SiteConfig(qualification=Qualification(questions=["Team size?", "Current tool?"]))
    request = turn("s", SESSION, 1, "ada@example.com")
    lead = [request, ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")]
    applied = await apply(3, ["propose_demo", "collect_email", "suggest_follow_up"], *lead,
                          *asked(2, ["ask_qualifying_question"], question="Team size?"), config=config,
                          branch="POST_CONVERSION")
    assert applied.qualification_question == "Current tool?"
    assert applied.skills == ["ask_qualifying_question", "suggest_follow_up"]
    assert applied.rules == ["email_known", "post_conversion"]  # the lead's e-mail is known


async def test_a_redelivered_route_gives_the_same_skills_and_question():
    """When the turn's own SkillsApplied is already stored, the rules decide the same again
    (same question, not the next one: the router's redelivered handling stores the same)."""
    config = SiteConfig(qualification=Qualification(questions=["Team size?", "Current tool?"]))
    request = turn("s", SESSION, 1, "ada@example.com")
    lead = [request, ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")]
    given, decision = routed(2, ["suggest_follow_up"], branch="POST_CONVERSION")
    first = applied_in(config, *lead, *given, decision)
    stored = ev.follow(decision, ev.SkillsApplied, "intent_router", skills=first[0], rules=first[1],
                       qualification_question=first[2])
    again = applied_in(config, *lead, *given, decision, stored)
    assert first[2] == again[2] == "Team size?" and again == first


async def test_skills_the_site_disabled_are_dropped_and_a_hack_ends_plainly():
    only_follow_up = SiteConfig(skills=Skills(enabled=["suggest_follow_up"]))
    applied = await apply(3, ["propose_demo", "suggest_follow_up"], config=only_follow_up)
    assert applied.skills == ["suggest_follow_up"] and applied.rules == ["not_enabled"]
    hack = await apply(3, ["share_resource"], intent="HACK", route="REDIRECT", branch="REDIRECT_HACK")
    assert hack.skills == ["none"] and hack.rules == ["hack"]


async def test_the_turn_that_ends_the_booking_asks_no_qualification_question_whenever_the_step_is_stored():
    """The booking handler's last step of turn 2 may be stored before the rules read the
    state (a redelivered handling): as of the route, the booking was still going, so no post-conversion question."""
    config = SiteConfig(qualification=Qualification(questions=["Team size?", "Current tool?"]))
    request = turn("s", SESSION, 1, "I'd like a demo")
    lead = [request, ev.follow(request, ev.RouteDecided, "intent_router", route="BOOKING", reason="t",
                               intent="BOOKING", branch="DEMO_REQUESTED"),
            ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")]
    given, decision = routed(2, ["suggest_follow_up"], intent="BOOKING", route="BOOKING", branch="STAY")
    done = ev.follow(decision, ev.BookingProgressed, "booking_handler", collected={"company": "Acme"}, done=True)
    for stored in ([], [done]):
        _, rules, question = applied_in(config, *lead, *given, decision, *stored)
        assert question is None and "post_conversion" not in rules, stored
