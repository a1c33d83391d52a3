"""The booking flow's decision, pure: given a conversation's events and the site's booking
form, what this turn collects, what the reply must say, the next field and the link
(`booking_handler.plan`). The node on the bus is tested in test_replies_without_llm.py
and test_e2e.py."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from services.responder.booking_handler import Step, plan
from shared import events as ev
from shared.site_config import CTA, Booking, FormField, SiteConfig
from tests.helpers import state_of, turn

EMAIL = FormField(name="email", label="Work email", kind="email")
TEAM = FormField(name="team_size", label="Number of technicians", kind="choice", choices=["1-10", "11-50", "51-200"])
CONFIG = SiteConfig(name="Tidewise", cta=CTA(booking_url="https://tidewise.example/book?src=chat"),
                    booking=Booking(fields=[EMAIL, TEAM]))


def routed(request: ev.TurnRequested, branch: str, route: str = "BOOKING") -> ev.RouteDecided:
    return ev.follow(request, ev.RouteDecided, "test", route=route, branch=branch, reason="test")


def asked(request: ev.TurnRequested, field: str | None, **collected: str) -> ev.BookingProgressed:
    return ev.follow(request, ev.BookingProgressed, "test", pending_field=field, collected=collected)


def link_values(link: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(link).query)


def test_a_demo_request_starts_the_flow_by_asking_the_first_field():
    first = turn("s", "b1", 1, "I'd like to book a demo")
    new, step, upcoming, link = plan(state_of(first, routed(first, "DEMO_REQUESTED")), 1, "DEMO_REQUESTED", CONFIG)
    assert new == {}
    assert step == Step("ask", EMAIL, first=True, thanks=False)
    assert upcoming == EMAIL and link_values(link) == {"src": ["chat"]}


def test_an_email_while_it_is_asked_is_collected_and_the_next_field_asked():
    first = turn("s", "b2", 1, "I'd like to book a demo")
    second = turn("s", "b2", 2, "sure, Ada@Acme.io")
    state = state_of(first, routed(first, "DEMO_REQUESTED"), asked(first, "email"), second, routed(second, "STAY"))
    new, step, upcoming, link = plan(state, 2, "STAY", CONFIG)
    assert new == {"email": "ada@acme.io"}
    assert step == Step("ask", TEAM, first=False, thanks=True)
    assert upcoming == TEAM and link_values(link) == {"src": ["chat"], "email": ["ada@acme.io"]}


def test_an_email_given_with_the_demo_request_is_taken_at_once():
    first = turn("s", "b3", 1, "Book me a demo, I'm ada@acme.io")
    new, step, upcoming, _ = plan(state_of(first, routed(first, "DEMO_REQUESTED")), 1, "DEMO_REQUESTED", CONFIG)
    assert new == {"email": "ada@acme.io"}
    assert step == Step("ask", TEAM, first=True, thanks=True) and upcoming == TEAM


def test_a_malformed_email_is_asked_again_quoting_it():
    first = turn("s", "b4", 1, "I'd like to book a demo")
    second = turn("s", "b4", 2, "ada@acme")
    state = state_of(first, routed(first, "DEMO_REQUESTED"), asked(first, "email"), second, routed(second, "STAY"))
    new, step, upcoming, _ = plan(state, 2, "STAY", CONFIG)
    assert new == {} and step == Step("invalid", EMAIL, answer="ada@acme") and upcoming == EMAIL


def test_an_answer_outside_the_choices_offers_them_again():
    first = turn("s", "b5", 1, "ada@acme.io, book a demo")
    second = turn("s", "b5", 2, "quite a lot of them")
    state = state_of(first, routed(first, "DEMO_REQUESTED"), asked(first, "team_size", email="ada@acme.io"),
                     second, routed(second, "STAY"))
    new, step, _, _ = plan(state, 2, "STAY", CONFIG)
    assert new == {} and step == Step("not_a_choice", TEAM)


def test_the_last_field_ends_the_flow_with_the_link_carrying_every_answer():
    first = turn("s", "b6", 1, "ada@acme.io, book a demo")
    second = turn("s", "b6", 2, "we are 11-50")
    state = state_of(first, routed(first, "DEMO_REQUESTED"), asked(first, "team_size", email="ada@acme.io"),
                     second, routed(second, "STAY"))
    new, step, upcoming, link = plan(state, 2, "STAY", CONFIG)
    assert new == {"team_size": "11-50"} and upcoming is None
    assert step == Step("done", thanks=True, link=link)
    assert link_values(link) == {"src": ["chat"], "email": ["ada@acme.io"], "team_size": ["11-50"]}


def test_a_field_is_only_parsed_when_the_turn_answers_it():
    """A product question mid-booking (branch PAUSE) collects nothing and asks the field again."""
    first = turn("s", "b7", 1, "I'd like to book a demo")
    second = turn("s", "b7", 2, "11-50")
    state = state_of(first, routed(first, "DEMO_REQUESTED"), asked(first, "team_size", email="ada@acme.io"),
                     second, routed(second, "PAUSE", route="ANSWER"))
    new, step, _, _ = plan(state, 2, "PAUSE", CONFIG)
    assert new == {} and step == Step("ask", TEAM, first=False, thanks=False)
