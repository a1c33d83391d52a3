"""interest_signals_detector, given-when-then: given the conversation so far, when a turn is
requested, then the InterestSignalsDetected it decides: this message's buying signals by the
local rules on the real local model, the turn's score added to the previous turn's
cumulative score, engagement counted over the visitor's messages; with the LLM backend, the
LLM's signals, or the local rules when its answer is unusable. The signal patterns alone:
test_router.py."""

from __future__ import annotations

import msgspec
import pytest

from services.router import interest_signals_detector
from services.router import signals as sig
from services.router.classifiers import IntentClassifier
from services.router.local_model import LocalIntentModel
from services.router.runtime import RouterParts
from shared import events as ev
from shared.embeddings import shared_embedder
from shared.llm import LLMError
from tests.helpers import StructuredLLM, decide, turn


@pytest.fixture(scope="module")
def parts():
    """The real local model (MiniLM ONNX + trained classifier), loaded once; no LLM."""
    model = LocalIntentModel.load_or_train(shared_embedder().load())
    return RouterParts(classifier=IntentClassifier(model, None, backend="local"), rules=sig.SignalRules.load(),
                       llm=None)


def with_llm(parts, llm) -> RouterParts:
    return RouterParts(classifier=parts.classifier, rules=parts.rules, llm=llm, signals_backend="llm")


async def detect(parts, message, *given, number=1) -> ev.InterestSignalsDetected:
    (detected,) = (await decide(interest_signals_detector.make_node(parts), turn("s", "i1", number, message),
                                *given)).events
    assert isinstance(detected, ev.InterestSignalsDetected) and set(detected.signals) == set(sig.SIGNALS)
    return detected


def on(detected) -> set[str]:
    return {name for name, found in detected.signals.items() if found}


@pytest.mark.parametrize(("message", "signals"), [
    ("How much does it cost per user?", {"pricing_interest"}),
    ("Can I book a demo for next Tuesday?", {"demo_interest"}),
    ("We currently use ServiceTitan", {"competitor_mentioned"}),
    ("Quels sont vos tarifs ?", {"pricing_interest"}),
    ("No demo, thanks, stop asking", set()),  # "demo", but most likely STOP_BOOKING
    ("Does it work offline?", set()),
])
async def test_the_signals_of_a_message(parts, message, signals):
    detected = await detect(parts, message)
    assert on(detected) == signals and detected.classifier == "local"
    assert detected.turn_score == sig.turn_score(parts.rules, detected.signals)
    assert detected.score == detected.turn_score  # the first turn: nothing before it
    assert (detected.turn_score > 0) == bool(signals)


async def test_the_interest_score_accumulates_across_turns(parts):
    """The previous score is the one the previous turn's InterestSignalsDetected left in the state."""
    first_request = turn("s", "i1", 1, "How much does it cost per user?")
    (first,) = (await decide(interest_signals_detector.make_node(parts), first_request)).events
    second = await detect(parts, "We have 40 technicians and need it live next month.", first_request, first,
                          number=2)
    assert on(first) == {"pricing_interest"} and {"team_size", "timeline"} <= on(second)
    assert second.score == pytest.approx(first.score + second.turn_score) and second.score > second.turn_score


async def test_the_score_is_capped_at_one(parts):
    earlier = turn("s", "i1", 1, "hello")
    high = ev.follow(earlier, ev.InterestSignalsDetected, "interest_signals_detector", signals={}, score=0.9)
    detected = await detect(parts, "We have 40 technicians and need it live next month.", earlier, high, number=2)
    assert detected.turn_score > 0.1 and detected.score == 1.0


async def test_engagement_is_a_long_message_after_a_few_visitor_messages(parts):
    message = "We are looking at options to schedule our field crews better"
    assert "engagement" not in on(await detect(parts, message))
    earlier = [turn("s", "i1", 1, "hello"), turn("s", "i1", 2, "a question")]
    assert "engagement" in on(await detect(parts, message, *earlier, number=3))


# --- the LLM backend ------------------------------------------------------------------------


async def test_the_llm_backend_reports_the_llms_signals(parts):
    llm = StructuredLLM(sig.SignalsOutput(timeline=True, team_size=True))
    earlier = turn("s", "i1", 1, "We are 40 technicians")
    detected = await detect(with_llm(parts, llm), "We want it by March", earlier, number=2)
    assert detected.classifier == "llm" and on(detected) == {"timeline", "team_size"}
    assert detected.turn_score == sig.turn_score(parts.rules, detected.signals)
    (call,) = llm.calls
    system, user = call
    assert "We are 40 technicians" in user["content"] and "We want it by March" in user["content"]


@pytest.mark.parametrize("failure", [LLMError("the provider keeps failing"), msgspec.ValidationError("bad answer")],
                         ids=["llm_error", "invalid_answer"])
async def test_an_unusable_llm_answer_leaves_it_to_the_local_rules(parts, failure):
    llm = StructuredLLM(failure)
    detected = await detect(with_llm(parts, llm), "How much does it cost per user?")
    assert len(llm.calls) == 1
    assert detected.classifier == "local" and on(detected) == {"pricing_interest"}


async def test_a_message_without_words_is_not_sent_to_the_llm(parts):
    llm = StructuredLLM(sig.SignalsOutput(pricing_interest=True))
    detected = await detect(with_llm(parts, llm), "🙂🙂")
    assert llm.calls == [] and detected.classifier == "local" and on(detected) == set()
