"""booking_handler, given-when-then: given a conversation's events and the site's booking
form, when a turn is routed to BOOKING, what it records (BookingProgressed, LeadCaptured)
and replies. Without an endpoint for the `redirect` role the reply is the localized
template. The plan underneath (`booking_handler.plan`: what this turn collects, what the
reply must say, the next field and the link) and the wording are tested on their own. The
node on the bus is tested in test_replies_without_llm.py and test_e2e_http.py."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from services.responder import booking_handler
from services.responder.booking_handler import STOP, Step, plan, wording
from shared import events as ev
from shared.llm import LLMClient
from shared.site_config import CTA, Booking, FormField, SiteConfig
from tests.helpers import decide, state_of, turn

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


NODE = booking_handler.make_node(LLMClient({}))  # no role has an endpoint: templates


def recorded(decision) -> tuple[list, str]:
    """What the turn records (every event but the reply), and the reply's text as streamed."""
    *records, reply = decision.events
    assert isinstance(reply, ev.ResponseCompleted) and reply.node == "booking_handler" and reply.backend == "template"
    assert "".join(t.content for t in decision.tokens) == reply.text
    return [(type(e).__name__, *_fields(e)) for e in records], reply.text


def _fields(event) -> tuple:
    if isinstance(event, ev.BookingProgressed):
        return event.pending_field, event.collected, event.done
    return event.email, event.capture_context


# --- the node: given the conversation, when routed to BOOKING, then -----------------------


async def test_a_demo_request_asks_the_first_field():
    first = turn("s", "n1", 1, "I'd like to book a demo")
    records, text = recorded(await decide(NODE, routed(first, "DEMO_REQUESTED"), first, config=CONFIG))
    assert records == [("BookingProgressed", "email", {}, False)]
    assert text == "I'd be glad to set up a demo of Tidewise. Could you give me your work email?"


async def test_an_email_is_collected_captures_the_lead_and_asks_the_next_field():
    first = turn("s", "n2", 1, "I'd like to book a demo")
    second = turn("s", "n2", 2, "sure, Ada@Acme.io")
    decision = await decide(NODE, routed(second, "STAY"), first, routed(first, "DEMO_REQUESTED"),
                            asked(first, "email"), second, config=CONFIG)
    records, text = recorded(decision)
    assert records == [("BookingProgressed", "team_size", {"email": "ada@acme.io"}, False),
                       ("LeadCaptured", "ada@acme.io", "in_chat_booking")]
    assert text == "Thank you. Which best describes your number of technicians: 1-10 / 11-50 / 51-200?"


async def test_a_lead_already_captured_is_not_captured_again():
    first = turn("s", "n3", 1, "Book a demo, I'm ada@acme.io")
    second = turn("s", "n3", 2, "actually use bob@acme.io")
    captured = ev.follow(first, ev.LeadCaptured, "test", email="ada@acme.io")
    decision = await decide(NODE, routed(second, "STAY"), first, routed(first, "DEMO_REQUESTED"), captured,
                            asked(first, "team_size", email="ada@acme.io"), second, config=CONFIG)
    records, _ = recorded(decision)
    assert [r[0] for r in records] == ["BookingProgressed"]


async def test_an_invalid_answer_is_asked_again_and_nothing_collected():
    first = turn("s", "n4", 1, "I'd like to book a demo")
    second = turn("s", "n4", 2, "ada@acme")
    decision = await decide(NODE, routed(second, "STAY"), first, routed(first, "DEMO_REQUESTED"),
                            asked(first, "email"), second, config=CONFIG)
    records, text = recorded(decision)
    assert records == [("BookingProgressed", "email", {}, False)]
    assert text == "That doesn't look like a valid work email. Could you check it and send it again?"


async def test_the_last_answer_ends_the_flow_with_the_link():
    first = turn("s", "n5", 1, "ada@acme.io, book a demo")
    second = turn("s", "n5", 2, "we are 11-50")
    decision = await decide(NODE, routed(second, "STAY"), first, routed(first, "DEMO_REQUESTED"),
                            asked(first, "team_size", email="ada@acme.io"), second, config=CONFIG)
    records, text = recorded(decision)
    assert records == [("BookingProgressed", None, {"team_size": "11-50"}, True)]
    prefix = "Thank you. You're all set. Pick a time for your demo here: "
    assert text.startswith(prefix)
    assert link_values(text.removeprefix(prefix)) == {"src": ["chat"], "email": ["ada@acme.io"], "team_size": ["11-50"]}


async def test_stop_leaves_the_flow_politely():
    first = turn("s", "n6", 1, "I'd like to book a demo")
    second = turn("s", "n6", 2, "no thanks, not now")
    decision = await decide(NODE, routed(second, "STOP"), first, routed(first, "DEMO_REQUESTED"),
                            asked(first, "email"), second, config=CONFIG)
    records, text = recorded(decision)
    assert records == [("BookingProgressed", None, {}, True)]
    assert text.startswith("No problem. You can ask for a demo any time")


async def test_a_turn_routed_elsewhere_is_not_its_to_answer():
    first = turn("s", "n7", 1, "I'd like to book a demo")
    for route in ("ANSWER", "REDIRECT"):
        assert (await decide(NODE, routed(first, "DEFAULT", route=route), first, config=CONFIG)).events == []


# --- the plan, pure ------------------------------------------------------------------------


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


# --- the wording, pure ---------------------------------------------------------------------


def test_booking_templates_ask_the_fields_label_and_give_the_link():
    assert wording(Step("ask", EMAIL, first=True), "en", "Tidewise") == (
        "I'd be glad to set up a demo of Tidewise. Could you give me your work email?")
    choice = wording(Step("ask", TEAM, thanks=True), "en", "Tidewise")
    assert choice == "Thank you. Which best describes your number of technicians: 1-10 / 11-50 / 51-200?"
    assert wording(Step("invalid", EMAIL, answer="ada@"), "de", "Tidewise").startswith(
        "Das scheint nicht gültig zu sein (Work email).")
    assert wording(Step("done", thanks=True, link="https://x.example/book?email=a%40b.co"), "es", "T") == (
        "Gracias. Todo listo. Elija un horario para su demostración aquí: https://x.example/book?email=a%40b.co")
    assert wording(STOP, "nl", "T").startswith("Geen probleem.")
