"""cli/measure/bench/critical_path.py: where an ANSWER turn's time goes, including what the
answer waited for the visitor's profile past its route and retrieval."""

from __future__ import annotations

import msgspec
import pytest

from cli.measure.bench import critical_path
from shared import events as ev
from tests.helpers import turn


def answered(profile_at: float, first_token_at: float):
    request = msgspec.structs.replace(turn("s", "c1", 1, "Pricing?"), ts=100.0)
    events = [
        request,
        ev.follow(request, ev.IntentClassified, "intent_classifier", ts=100.010, intent="LEARN", confidence=0.9,
                  classifier="local"),
        ev.follow(request, ev.InterestSignalsDetected, "interest_signals_detector", ts=100.012),
        ev.follow(request, ev.RouteDecided, "intent_router", ts=100.015, route="ANSWER", reason="t"),
        ev.follow(request, ev.RetrievalCompleted, "retrieval", ts=100.030),
        ev.follow(request, ev.EnrichmentCompleted, "enrichment", ts=100.005, profile=ev.VisitorProfile()),
        ev.follow(request, ev.ProfileInferred, "visitor_profiler", ts=profile_at, profile=ev.VisitorProfile()),
    ]
    return sorted(events, key=lambda e: e.ts), first_token_at


@pytest.mark.parametrize("profile_at,first_token_at,profile,waited,reply", [
    (100.008, 100.040, 8.0, 0.0, 10.0),  # in before retrieval: nothing waited
    (100.050, 100.060, 50.0, 20.0, 10.0),  # after retrieval: the answer waited 20 ms for it
    # Past the budget: it answered without; with no model call to tell them apart, the reply's
    # own time counts as waiting.
    (100.500, 100.190, 500.0, 160.0, 0.0),
])
def test_the_answer_waits_for_the_profile_only_past_its_route_and_retrieval(profile_at, first_token_at, profile,
                                                                            waited, reply):
    events, first_token = answered(profile_at, first_token_at)
    route, ms = critical_path.turn_segments(events, first_token, None, None)
    assert route == "ANSWER"
    assert ms["retrieval"] == pytest.approx(30.0) and ms["profile"] == pytest.approx(profile)
    assert ms["profile_wait"] == pytest.approx(waited) and ms["reply"] == pytest.approx(reply)


def test_the_profiles_wait_is_summed_up_over_answer_turns():
    turns = [("ANSWER", {"profile_wait": 0.0}), ("ANSWER", {"profile_wait": 40.0}), ("ANSWER", {}),
             ("BOOKING", {"profile_wait": 99.0}), ("ANSWER", {"profile_wait": 0.5})]
    waited = critical_path.profile_wait(turns)
    assert (waited["turns"], waited["waited"], waited["p50"]) == (3, 1, 0.5) and waited["p99"] > 39
    assert critical_path.profile_wait([("REDIRECT", {})]) == {}
