"""The `complete` event's metadata, pure: given a turn's events, what `finalize.metadata`
tells the browser (route, suggestions, form values and the CTA link they fill, skills,
booking, this turn's dialog flags, and the sources the answer was given, marked cited)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from services.responder import finalize
from shared import events as ev
from shared.site_config import CTA, Booking, FormField, SiteConfig
from tests.helpers import state_of, turn

CONFIG = SiteConfig(name="Tidewise", cta=CTA(label="Book a demo", booking_url="https://tidewise.example/book"),
                    booking=Booking(fields=[FormField(name="email", kind="email"), FormField(name="team_size")]))


def document(n: int, title: str) -> ev.RetrievedDocument:
    return ev.RetrievedDocument(n=n, document_type="chunk", title=title, source=f"https://tidewise.example/{n}",
                                snippet=f"{title}…", content=f"{title}: the text")


def answered_turn(session: str):
    request = turn("s", session, 1, "Do you integrate with Xero? I'm ada@acme.io")

    def then(cls, **fields):
        return ev.follow(request, cls, "test", **fields)

    return request, [
        request,
        then(ev.RouteDecided, route="ANSWER", branch="DEFAULT", intent="LEARN", reason="test"),
        then(ev.SkillsSelected, skills=["suggest_follow_up", "propose_demo"]),
        then(ev.SkillsApplied, skills=["suggest_follow_up"]),
        then(ev.RetrievalCompleted, documents=[document(1, "Integrations"), document(2, "Pricing")]),
        then(ev.ResponseCompleted, node="answer_writer", text="Yes, Xero syncs every 10 minutes [1].",
             token_count=8, sources=[1, 2]),
        then(ev.FormFieldsExtracted, values={"email": "ada@acme.io"}),
        then(ev.DialogStateExtracted, flags={"email_captured": True, "asked_visitor": False}),
    ]


def test_an_answered_turn_tells_the_browser_everything_it_shows():
    request, events = answered_turn("f1")
    suggestions = ev.follow(request, ev.SuggestionsGenerated, "test", kind="follow_up",
                            suggestions=["What does it cost?", "Is there a trial?"])
    meta = finalize.metadata(state_of(*events), 1, suggestions, CONFIG)
    assert (meta["route"], meta["branch"], meta["intent"], meta["fallback_used"]) == ("ANSWER", "DEFAULT", "LEARN", False)
    assert meta["suggested_follow_ups"] == ["What does it cost?", "Is there a trial?"] and meta["suggested_answers"] == []
    assert meta["form_values"] == {"email": "ada@acme.io"}
    assert parse_qs(urlsplit(meta["cta_url_overrides"]["booking_url"]).query) == {"email": ["ada@acme.io"]}
    assert meta["cta"] == {"label": "Book a demo", "url": "https://tidewise.example/book"}
    assert meta["skill_selection_state"] == {"selected": ["suggest_follow_up", "propose_demo"],
                                             "applied": ["suggest_follow_up"], "qualification_question": None}
    assert meta["booking"] == {"active": False, "pending_field": None, "lead_captured": False}
    assert meta["dialog_flags"] == {"email_captured": True, "asked_visitor": False}
    assert [(s["n"], s["title"], s["cited"]) for s in meta["sources"]] == [(1, "Integrations", True),
                                                                         (2, "Pricing", False)]
    assert all("content" not in s for s in meta["sources"])  # the browser gets no document text


def test_answer_buttons_and_an_earlier_turns_flags():
    """Suggestions of kind `answers` go to the answer buttons; dialog flags of another turn are not this turn's."""
    request, events = answered_turn("f2")
    later = turn("s", "f2", 2, "ok")
    suggestions = ev.follow(later, ev.SuggestionsGenerated, "test", kind="answers", suggestions=["11-50", "51-200"])
    meta = finalize.metadata(state_of(*events, later), 2, suggestions, CONFIG)
    assert meta["suggested_answers"] == ["11-50", "51-200"] and meta["suggested_follow_ups"] == []
    assert meta["dialog_flags"] == {} and meta["sources"] == [] and meta["route"] is None


def test_a_site_without_a_booking_link_gets_no_cta():
    request, events = answered_turn("f3")
    none = ev.follow(request, ev.SuggestionsGenerated, "test", kind="none")
    meta = finalize.metadata(state_of(*events), 1, none)  # no site config: the defaults, no link
    assert meta["cta"] is None and meta["cta_url_overrides"] == {}
    assert meta["suggested_follow_ups"] == [] and meta["suggested_answers"] == []
