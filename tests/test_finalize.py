"""finalize, given-when-then: given a turn's events, when its suggestions are stored, the
turn closes with `TurnCompleted`, whose metadata (`finalize.metadata`) tells the browser the
route, suggestions, form values and the CTA link they fill, skills, booking, this turn's
dialog flags, and the sources the answer was given, marked cited."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from services.responder import finalize
from shared import events as ev
from shared.site_config import CTA, Booking, FormField, SiteConfig
from tests.helpers import decide, state_of, turn

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


async def test_the_turn_closes_with_its_metadata_caused_by_its_suggestions():
    request, events = answered_turn("f4")
    suggestions = ev.follow(request, ev.SuggestionsGenerated, "test", kind="follow_up",
                            suggestions=["Is there a trial?"])
    (completed,) = (await decide(finalize.make_node(), suggestions, *events, config=CONFIG)).events
    assert isinstance(completed, ev.TurnCompleted) and completed.causation_id == suggestions.event_id
    assert completed.turn == 1 and completed.metadata["suggested_follow_ups"] == ["Is there a trial?"]
    assert completed.metadata["route"] == "ANSWER" and completed.metadata["dialog_flags"]["email_captured"]
    assert parse_qs(urlsplit(completed.metadata["cta_url_overrides"]["booking_url"]).query) == {
        "email": ["ada@acme.io"]}  # the site's config reached it


async def test_what_is_still_missing_at_the_deadline_is_left_out_never_waited_for():
    """The runner waits, at most FINALIZE_WAIT_S, for the turn's dialog state, form fields and
    enrichment; the turn closes on whatever is there by then."""
    request, events = answered_turn("f5")
    without_post_processing = [e for e in events if not isinstance(e, (ev.FormFieldsExtracted,
                                                                       ev.DialogStateExtracted))]
    none = ev.follow(request, ev.SuggestionsGenerated, "test", kind="none")
    decision = await decide(finalize.make_node(), none, *without_post_processing, config=CONFIG,
                            late=finalize.GATHERED)
    (completed,) = decision.events
    assert completed.metadata["form_values"] == {} and completed.metadata["dialog_flags"] == {}
    assert completed.metadata["cta_url_overrides"] == {}
    assert finalize.make_node().needs.waits[0].kinds == finalize.GATHERED
