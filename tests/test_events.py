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


def _call_event(messages, response="ok"):
    call = ev.LLMCall(role="answer", model="m", base_url="http://x", messages=messages, response_text=response)
    return ev.LLMCallRecorded(event_id="e", site="s", session_id="x", turn=1, ts=0.0, node="answer_writer", call=call)


def test_an_llm_call_record_that_fits_is_left_whole():
    event = _call_event([{"role": "user", "content": "hello"}])
    assert ev.fit_llm_call(event, 10_000) is event


def test_an_llm_call_record_too_big_for_the_bus_is_cut_visibly_to_fit():
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "é" * 300_000},
                {"role": "assistant", "content": "b" * 50_000}, {"role": "user", "content": "current question"}]
    event = _call_event(messages, response="r" * 200_000)
    fitted = ev.fit_llm_call(event, 100_000)
    assert 90_000 < len(ev.encode(fitted)) <= 100_000  # cut to fit, not far below
    contents = [m["content"] for m in fitted.call.messages]
    assert contents[0] == "rules" and contents[3] == "current question"  # short ones untouched
    assert "…[truncated " in contents[1] and "…[truncated " in fitted.call.response_text
    kept = sum(len(c) for c in contents) + len(fitted.call.response_text)
    assert fitted.call.truncated > 400_000 and kept < 100_000
    assert event.call.messages[1]["content"] == "é" * 300_000  # the call itself is not modified
    assert ev.decode(ev.encode(fitted)) == fitted


def test_a_record_of_countless_messages_keeps_a_note_instead_of_them():
    event = _call_event([{"role": "user", "content": "x"}] * 20_000)
    fitted = ev.fit_llm_call(event, 50_000)
    assert len(ev.encode(fitted)) <= 50_000
    assert fitted.call.messages == [{"role": "system", "content": "…[truncated 20000 chars] (20000 messages)"}]


def test_events_recorded_before_the_version_fields_still_decode():
    """Logs are kept for ever: an event stored before a field existed decodes with its default."""
    route = ev.decode(b'{"type":"route_decided","event_id":"e","site":"a","session_id":"s","turn":1,"ts":1.0,'
                      b'"causation_id":"c","producer":"intent_router","schema_version":1,"input_seq":4,'
                      b'"route":"ANSWER","reason":"r"}')
    assert route.config_version == "" and route.input_seq == 4
    classified = ev.decode(b'{"type":"intent_classified","event_id":"e","site":"a","session_id":"s","turn":1,'
                           b'"ts":1.0,"intent":"LEARN","confidence":0.9,"classifier":"local"}')
    assert (classified.classifier_version, classified.embedding_version, classified.llm_roles) == ("", "", {})
    reply = ev.decode(b'{"type":"response_completed","event_id":"e","site":"a","session_id":"s","turn":1,"ts":1.0,'
                      b'"node":"answer_writer","text":"t","token_count":1}')
    assert reply.llm_roles == {}  # a replay reads those roles from the turn's LLM calls
    call = ev.decode(b'{"type":"llm_call_recorded","event_id":"e","site":"a","session_id":"s","turn":1,"ts":1.0,'
                     b'"node":"answer_writer","call":{"role":"answer","model":"m","base_url":"http://x",'
                     b'"messages":[],"params":{"temperature":0.2},"usage":{}}}')
    assert (call.call.served_model, call.call.system_fingerprint, call.call.params) == ("", "", {"temperature": 0.2})


@pytest.mark.parametrize("subject,envelope,agrees", [
    ("conv.acme.s1.turn_requested", ("acme", "s1", "turn_requested", 3), True),
    ("briefs.acme.s1.brief_requested", ("acme", "s1", "brief_requested", 3), True),
    ("tokens.acme.s1.3", ("acme", "s1", "token_chunk", 3), True),
    ("conv.acme.s1.turn_requested", ("other", "s1", "turn_requested", 3), False),
    ("conv.acme.s1.turn_requested", ("acme", "s2", "turn_requested", 3), False),
    ("conv.acme.s1.turn_requested", ("acme", "s1", "route_decided", 3), False),
    ("tokens.acme.s1.3", ("acme", "s1", "token_chunk", 4), False),
    ("conv.acme.s1.x.turn_requested", ("acme", "s1.x", "turn_requested", 3), False),  # a dot in a name
    ("conv.acme.s1", ("acme", "s1", "turn_requested", 3), False),
    ("other.acme.s1.turn_requested", ("acme", "s1", "turn_requested", 3), False),
])
def test_an_envelope_agrees_only_with_the_subject_it_names(subject, envelope, agrees):
    from shared.subjects import envelope_mismatch
    reason = envelope_mismatch(subject, *envelope)
    assert (reason is None) == agrees, reason
