"""Skill selection, given-when-then: given the conversation so far, when a turn is requested,
then the SkillsSelected stored for it: with the local backend, the intent router's, by the
local selection rules on the turn's analyses (the real local model's intent, this turn's
signals and the cumulative interest score), without asking for an e-mail the
conversation already knows; with the LLM backend, the skill selector's: the LLM's choice among the site's enabled
skills, or the local selection when its answer is unusable. The selection rules alone
(skills.select): test_router.py."""

from __future__ import annotations

import msgspec
import pytest

from services.router import intent_classifier, intent_router, interest_signals_detector, skill_selector
from services.router import signals as sig
from services.router.classifiers import IntentClassifier
from services.router.local_model import LocalIntentModel
from services.router.runtime import RouterParts
from services.router.skill_selector import SkillsOutput
from shared import events as ev
from shared.embeddings import shared_embedder
from shared.llm import LLMError
from shared.site_config import SiteConfig, Skills
from tests.helpers import StructuredLLM, decide, turn


@pytest.fixture(scope="module")
def parts():
    """The real local model (MiniLM ONNX + trained classifier), loaded once; no LLM."""
    model = LocalIntentModel.load_or_train(shared_embedder().load())
    return RouterParts(classifier=IntentClassifier(model, None, backend="local"), rules=sig.SignalRules.load(),
                       llm=None)


def with_llm(parts, llm) -> RouterParts:
    return RouterParts(classifier=parts.classifier, rules=parts.rules, llm=llm, skills_backend="llm")


async def select(parts, message, *given, number=1, config=None) -> ev.SkillsSelected:
    """The selection for a turn of `message`: with the local backend, on the analyses the
    real intent classifier and signal detector make of it (either one stored last)."""
    request = turn("s", "k1", number, message)
    if parts.skills_backend == "llm":
        (selected,) = (await decide(skill_selector.make_node(parts), request, *given, config=config)).events
    else:  # the intent router selects where it joins the two analyses
        node = intent_router.make_node(parts)
        analyses = [e for make in (intent_classifier.make_node, interest_signals_detector.make_node)
                    for e in (await decide(make(parts), request, *given, config=config)).events]
        first, last = analyses
        selected = (await decide(node, last, *given, request, first, config=config)).events[0]
        again = (await decide(node, first, *given, request, last, config=config)).events[0]
        assert again.event_id == selected.event_id, "one selection a turn, whichever analysis came last"
    assert isinstance(selected, ev.SkillsSelected) and selected.turn == number
    return selected


def scored(score: float) -> list[ev.Envelope]:
    """A first turn that left the cumulative interest score at `score`."""
    request = turn("s", "k1", 1, "hello")
    return [request, ev.follow(request, ev.InterestSignalsDetected, "interest_signals_detector", signals={},
                               score=score)]


@pytest.mark.parametrize(("message", "intent", "skills"), [
    ("I'd like to book a demo", "BOOKING", ["propose_demo", "collect_email"]),
    ("Does it integrate with QuickBooks?", "LEARN", ["suggest_follow_up"]),
    ("We are a team of 12 plumbers", "CONTEXT", ["ask_qualifying_question", "suggest_follow_up"]),
    ("I forgot my password and can't sign in", "SUPPORT", ["share_resource"]),
    ("Tell me a joke", "OFFTOPIC", ["none"]),
    ("No demo, thanks, stop asking", "STOP_BOOKING", ["none"]),
    ("🙂🙂", "OFFTOPIC", ["none"]),  # no words: no model
])
async def test_the_skills_a_message_calls_for(parts, message, intent, skills):
    selected = await select(parts, message)
    assert (selected.intent, selected.skills, selected.classifier) == (intent, skills, "local")


async def test_a_question_of_an_interested_visitor_proposes_a_demo(parts):
    """The score so far comes from the previous turn's InterestSignalsDetected; this turn's
    signals add to it (pricing: the e-mail too)."""
    assert (await select(parts, "Does it integrate with QuickBooks?", *scored(0.2), number=2)).skills == [
        "suggest_follow_up"]
    assert (await select(parts, "Does it integrate with QuickBooks?", *scored(0.7), number=2)).skills == [
        "propose_demo", "suggest_follow_up"]
    assert (await select(parts, "How much does it cost per user?", *scored(0.5), number=2)).skills == [
        "propose_demo", "collect_email", "suggest_follow_up"]


async def test_no_email_is_asked_once_the_conversation_knows_it(parts):
    request = turn("s", "k1", 1, "I'm ada@example.com")
    known = [request, ev.follow(request, ev.FormFieldsExtracted, "form_field_extractor",
                                values={"email": "ada@example.com"})]
    assert (await select(parts, "I'd like to book a demo", *known, number=2)).skills == ["propose_demo"]


async def test_only_the_skills_the_site_enabled(parts):
    config = SiteConfig(skills=Skills(enabled=["collect_email", "suggest_follow_up"]))
    assert (await select(parts, "I'd like to book a demo", config=config)).skills == ["collect_email"]


# --- the LLM backend ------------------------------------------------------------------------


async def test_the_llm_backend_picks_among_the_enabled_skills(parts):
    llm = StructuredLLM(SkillsOutput(intent="BOOKING", skills=["propose_demo", "share_resource"]))
    config = SiteConfig(skills=Skills(enabled=["propose_demo", "suggest_follow_up"]))
    selected = await select(with_llm(parts, llm), "Can we talk next week?", *scored(0.45), number=2, config=config)
    assert (selected.classifier, selected.intent, selected.skills) == ("llm", "BOOKING", ["propose_demo"])
    ((system, user),) = llm.calls
    assert "propose_demo, suggest_follow_up" in system["content"]  # what it may choose from
    assert "Interest score so far: 0.45 (threshold 0.60)" in user["content"]


async def test_an_llm_choice_of_nothing_enabled_is_none(parts):
    llm = StructuredLLM(SkillsOutput(intent="SUPPORT", skills=["share_resource"]))
    config = SiteConfig(skills=Skills(enabled=["suggest_follow_up"]))
    selected = await select(with_llm(parts, llm), "I can't log in", config=config)
    assert (selected.classifier, selected.skills) == ("llm", ["none"])


@pytest.mark.parametrize("failure", [LLMError("the provider keeps failing"), msgspec.ValidationError("bad answer")],
                         ids=["llm_error", "invalid_answer"])
async def test_an_unusable_llm_answer_leaves_it_to_the_local_selection(parts, failure):
    llm = StructuredLLM(failure)
    selected = await select(with_llm(parts, llm), "I'd like to book a demo")
    assert len(llm.calls) == 1
    assert (selected.classifier, selected.intent, selected.skills) == ("local", "BOOKING",
                                                                        ["propose_demo", "collect_email"])
