"""The responder with no LLM endpoint for the `redirect` and `suggestions` roles: redirect and
booking replies from the localized templates, suggestions from the knowledge base and the
booking form, streamed and closed like any other turn, and no model asked."""

from __future__ import annotations

from contextlib import asynccontextmanager
from urllib.parse import parse_qs, urlsplit

import pytest

from services.responder import (answer_suggester, booking_handler, dialog_state_extractor, finalize,
                                follow_up_suggester, form_field_extractor, redirect_handler, replies,
                                suggestion_router, suggestions)
from shared import events as ev
from shared import subjects
from shared.config import LLM_ROLES, LLMRoleConfig
from shared.consumer import ConsumerRunner
from shared.llm import LLMClient
from shared.site_config import CTA, Booking, FormField, Redirects, SiteConfig
from tests.helpers import FixedConfigs, fast, isolated, wait_for
from tests.test_local_suggestions import faq_headings, kb

SESSION = "n1"
CONFIG = SiteConfig(
    name="Tidewise",
    cta=CTA(url="https://tidewise.example/demo", booking_url="https://tidewise.example/book"),
    booking=Booking(fields=[
        FormField(name="email", label="Work email", kind="email"),
        FormField(name="team_size", label="Number of technicians", kind="choice",
                  choices=["1-10", "11-50", "51-200", "200+"]),
    ]),
    redirects=Redirects(support="https://help.tidewise.example", careers="https://tidewise.example/careers",
                        press="mailto:press@tidewise.example"),
)


# --- the wording, pure --------------------------------------------------------------------


def test_every_template_exists_in_every_language_and_fills_in():
    fields = {"site_name": "S", "url": "U", "label": "L", "label_lc": "l", "choices": "C", "link": "K"}
    for group in ("redirect", "booking"):
        for key, table in replies.TEXTS[group].items():
            if key == "keywords":
                continue
            assert set(table) == {"en", "fr", "es", "de", "it", "pt", "nl"}, key
            for lang in table:
                assert "{" not in replies.text(f"{group}.{key}", lang, **fields), (key, lang)


# --- through the bus, no LLM endpoint ---------------------------------------------------------


@pytest.fixture
def client(llm):
    """The `answer` role has an endpoint (the scripted LLM); `redirect` and `suggestions` none."""
    return LLMClient({role: LLMRoleConfig(role=role, base_url=llm.base_url if role == "answer" else "", api_key="k",
                                          model="m", max_retries=0) for role in LLM_ROLES})


@asynccontextmanager
async def responder(bus, site, client):
    """The responder's reply, post-processing and finalize nodes, each its own consumer."""
    nodes = [redirect_handler.make_node(client), booking_handler.make_node(client),
             dialog_state_extractor.make_node(), form_field_extractor.make_node(), suggestion_router.make_node(),
             follow_up_suggester.make_node(client), answer_suggester.make_node(client), finalize.make_node(wait_s=0.1)]
    runners = [ConsumerRunner(bus, isolated(n, site), fast(), configs=FixedConfigs(CONFIG), start_lookback_s=5)
               for n in nodes]
    for runner in runners:
        await runner.start()
    try:
        yield
    finally:
        for runner in runners:
            await runner.stop()


async def say(bus, site, turn: int, message: str, route: str, intent: str, branch: str, visitor=None,
              documents=None) -> tuple[ev.TurnCompleted, str]:
    """One turn routed to `route`; the turn's completion and the tokens the browser got."""
    heard: list[ev.TokenChunk] = []

    async def on_token(msg):
        heard.append(ev.decode(msg.data))

    sub = await bus.nc.subscribe(subjects.tokens(site, SESSION, turn), cb=on_token)
    try:
        req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=SESSION, turn=turn, ts=ev.now(),
                               producer="test", message=message, visitor=visitor)
        await bus.publish(req)
        if documents is not None:
            await bus.publish(ev.follow(req, ev.RetrievalCompleted, "retrieval", documents=documents))
        await bus.publish(ev.follow(req, ev.RouteDecided, "intent_router", route=route, reason="t", intent=intent,
                                    branch=branch))

        async def completed():
            return [r.event for r in await bus.read(subjects.conv(site, SESSION, "turn_completed"))
                    if r.event.turn == turn]

        (done,) = await wait_for(completed)
    finally:
        await sub.unsubscribe()
    return done, "".join(t.content for t in sorted(heard, key=lambda t: t.index))


async def stored(bus, site, event_type: str) -> list:
    return [r.event for r in await bus.read(subjects.conv(site, SESSION, event_type))]


async def test_redirect_without_a_model_streams_the_support_url_in_german(bus, site, llm, client):
    llm.clear()
    async with responder(bus, site, client):
        done, streamed = await say(bus, site, 1, "Ich kann mich nicht bei meinem Konto anmelden, wer hilft mir?",
                                   "REDIRECT", "SUPPORT", "REDIRECT_SUPPORT")
    (reply,) = await stored(bus, site, "response_completed")
    assert reply.backend == "template" and reply.node == "redirect_handler" and reply.token_count >= 2
    # The responder's roles as it had them, for a replay to take the same paths.
    assert reply.llm_roles == {"answer": ev.LLMRole(model="m"), "redirect": ev.LLMRole(), "suggestions": ev.LLMRole()}
    assert streamed == reply.text and "https://help.tidewise.example" in reply.text
    assert "Gern beantworte ich Ihre Fragen zu Tidewise." in reply.text
    assert done.metadata["suggested_follow_ups"] == [] and done.metadata["route"] == "REDIRECT"
    assert await stored(bus, site, "llm_call_recorded") == [] and llm.requests() == []


async def test_the_widgets_language_beats_the_guess(bus, site, client):
    async with responder(bus, site, client):
        await say(bus, site, 1, "Login broken", "REDIRECT", "SUPPORT", "REDIRECT_SUPPORT",
                  visitor={"language": "fr-CA"})
    (reply,) = await stored(bus, site, "response_completed")
    assert reply.text.startswith("Pour toute aide sur votre compte") and "https://help.tidewise.example" in reply.text


async def test_booking_without_a_model_asks_the_labels_and_offers_the_choices(bus, site, llm, client):
    llm.clear()
    async with responder(bus, site, client):
        ask, ask_text = await say(bus, site, 1, "I'd like to book a demo", "BOOKING", "BOOKING", "DEMO_REQUESTED")
        choice, choice_text = await say(bus, site, 2, "sure, ada@example.com", "BOOKING", "BOOKING", "STAY")
        picked, picked_text = await say(bus, site, 3, "we are 11-50", "BOOKING", "BOOKING", "STAY")
    assert ask_text == "I'd be glad to set up a demo of Tidewise. Could you give me your work email?"
    assert ask.metadata["booking"]["pending_field"] == "email" and ask.metadata["suggested_answers"] == []
    assert choice_text == "Thank you. Which best describes your number of technicians: 1-10 / 11-50 / 51-200 / 200+?"
    assert choice.metadata["booking"]["lead_captured"] and choice.metadata["booking"]["pending_field"] == "team_size"
    assert choice.metadata["suggested_answers"] == ["1-10", "11-50", "51-200", "200+"]
    assert choice.metadata["suggested_follow_ups"] == []
    link = picked_text.rsplit(" ", 1)[-1]
    assert picked_text.startswith("Thank you. You're all set. Pick a time for your demo here: ")
    assert parse_qs(urlsplit(link).query) == {"email": ["ada@example.com"], "team_size": ["11-50"]}
    assert picked.metadata["booking"]["active"] is False
    assert [e.email for e in await stored(bus, site, "lead_captured")] == ["ada@example.com"]
    assert {r.backend for r in await stored(bus, site, "response_completed")} == {"template"}
    generated = await stored(bus, site, "suggestions_generated")
    assert generated and all(g.skipped == suggestions.NO_MODEL and g.error is None for g in generated)
    assert await stored(bus, site, "llm_call_recorded") == [] and llm.requests() == []


async def test_follow_ups_without_a_model_come_from_the_retrieved_knowledge_base(bus, site, llm, client):
    """The answer itself is stored as the answer writer would; its suggestions come from the
    turn's retrieved FAQ and pricing sections, minus what the conversation covered."""
    llm.clear()
    async with responder(bus, site, client):
        req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=SESSION, turn=1, ts=ev.now(),
                               producer="test", message="Is there a minimum contract length?")
        await bus.publish(req)
        await bus.publish(ev.follow(req, ev.RetrievalCompleted, "retrieval", documents=kb("faq", "pricing")))
        await bus.publish(ev.follow(req, ev.RouteDecided, "intent_router", route="ANSWER", reason="t", intent="LEARN",
                                    branch="DEFAULT"))
        await bus.publish(ev.follow(req, ev.ResponseCompleted, "answer_writer", node="answer_writer", token_count=9,
                                    text="No minimum on monthly billing; annual billing is a 12-month commitment [3]."))

        async def completed():
            return await stored(bus, site, "turn_completed")

        (done,) = await wait_for(completed)
    follow_ups = done.metadata["suggested_follow_ups"]
    assert follow_ups == ["How long does it take to get started?", "Can we migrate from another field-service tool?",
                          "Does Tidewise work for one-person businesses?"]
    assert set(follow_ups) <= faq_headings() and "Is there a minimum contract length?" not in follow_ups
    (generated,) = await stored(bus, site, "suggestions_generated")
    assert generated.kind == "follow_up" and generated.skipped == suggestions.NO_MODEL
    assert await stored(bus, site, "llm_call_recorded") == [] and llm.requests() == []
