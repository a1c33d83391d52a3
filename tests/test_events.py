"""Decoding is validation."""

from __future__ import annotations

import pytest

from shared import events as ev


def test_round_trip_keeps_the_tag_and_envelope():
    event = ev.TurnRequested(event_id="e1", site="acme", session_id="s", turn=1, ts=1.5, message="hi",
                             causation_id=None, producer="gateway")
    data = ev.encode(event)
    assert b'"type":"turn_requested"' in data
    assert ev.decode(data) == event


@pytest.mark.parametrize("payload, why", [
    (b"not json", "malformed"),
    (b'{"type":"no_such_event","event_id":"e","site":"a","session_id":"s","turn":1,"ts":1}', "invalid"),
    (b'{"type":"turn_requested","event_id":"e","site":"a","session_id":"s","turn":"one","ts":1,"message":"x"}', "invalid"),
    (b'{"type":"turn_requested","event_id":"e","site":"a","session_id":"s","turn":1,"ts":1}', "invalid"),
])
def test_bad_payloads_raise_bad_event(payload, why):
    with pytest.raises(ev.BadEvent, match=why):
        ev.decode(payload)


def test_derived_ids_are_stable_and_distinct():
    a = ev.derived_id("cause", "node", "k")
    assert a == ev.derived_id("cause", "node", "k")
    assert a != ev.derived_id("cause", "node", "k2")
    assert a != ev.derived_id("cause", "other", "k")


def test_every_event_type_is_in_the_union():
    assert set(ev.EVENT_TYPES) >= {"turn_requested", "route_decided", "response_completed", "turn_completed",
                                   "turn_failed", "token_chunk", "llm_call_recorded"}
