"""handoff_notifier. Given-when-then, no bus (claims in memory, a real HTTP receiver): what
the webhook tells the team's tool about the conversation, where it goes (the site's
`handoff.webhook_url`, else its `lead.webhook_url`, else LEAD_WEBHOOK_URL) and a request with
nowhere to go. Against a real JetStream: a Standard Webhooks signature the receiver verifies,
and one delivery per handoff request however often the bus delivers its event."""

from __future__ import annotations

from urllib.parse import urlsplit

import dataclasses
import json

import msgspec
import pytest
from standardwebhooks.webhooks import Webhook

from services.responder import handoff_notifier, webhook_claims
from services.responder.settings import LeadSettings
from services.responder.webhook_claims import handoff_id, handoff_key
from shared import events as ev
from shared import webhook_secret
from shared.node import Context, gather
from shared.site_config import Handoff, Lead, SiteConfig, SiteConfigError, SiteConfigs, validate
from shared.store import JetStreamStore
from shared.web import Outbound
from shared.webhook_secret import WebhookSecrets
from tests.helpers import ClaimsInMemory, decide, events_of, fast, isolated, start, turn, wait_for

DEPLOYMENT_SECRET = "deployment-secret"


@pytest.fixture
def receiver(webhook):
    """The module's webhook receiver (conftest.py), with no requests yet."""
    webhook.reset()
    return webhook


def to(url: str) -> LeadSettings:
    """Webhooks to `url` when the site names none, signed, retried without waiting long."""
    return LeadSettings(webhook_url=url, backoff_s=0.01, secrets=WebhookSecrets(deployment=DEPLOYMENT_SECRET),
                        outbound=Outbound(allowed=(urlsplit(url).netloc,) if url else ()))


def handoff(request: ev.TurnRequested, reason="visitor_asked", detail="asked for a person") -> ev.HandoffRequested:
    return ev.follow(request, ev.HandoffRequested, "handoff_handler", reason=reason, detail=detail)


async def test_the_webhook_tells_the_team_why_the_conversation_and_who_the_visitor_is(receiver):
    first = turn("s", "h1", 1, "Book a demo, I'm ada@example.com")
    answer = ev.follow(first, ev.ResponseCompleted, "booking_handler", node="booking_handler", text="Thanks!",
                       token_count=1, attempt=1)
    given = [first,
             ev.follow(first, ev.LeadCaptured, "booking_handler", email="ada@example.com"),
             answer,
             ev.follow(first, ev.EnrichmentCompleted, "enrichment", profile=ev.VisitorProfile(company_name="Globex")),
             ev.follow(first, ev.InterestSignalsDetected, "interest_signals_detector", signals={}, score=0.7)]
    asking = turn("s", "h1", 2, "Can I talk to a human?")
    requested = handoff(asking)
    node = handoff_notifier.make_node(ClaimsInMemory(handoff_key), to(receiver.url))
    (recorded,) = (await decide(node, requested, *given, asking)).events
    assert isinstance(recorded, ev.WebhookRecorded) and recorded.hook == "handoff" and recorded.ok
    assert recorded.causation_id == requested.event_id
    (delivered,) = receiver.requests
    assert delivered["headers"]["webhook-id"] == handoff_id("s", "h1", requested.event_id)
    payload = json.loads(delivered["body"])
    assert {k: payload[k] for k in ("event", "event_id", "site", "session_id", "turn", "reason", "detail")} == {
        "event": "handoff.requested", "event_id": requested.event_id, "site": "s", "session_id": "h1", "turn": 2,
        "reason": "visitor_asked", "detail": "asked for a person"}
    assert payload["transcript"] == [{"role": "user", "content": first.message, "turn": 1},
                                     {"role": "assistant", "content": "Thanks!", "turn": 1},
                                     {"role": "user", "content": asking.message, "turn": 2}]
    assert payload["visitor_profile"]["company_name"] == "Globex"
    assert payload["interest_score"] == 0.7 and payload["lead_email"] == "ada@example.com"


async def test_the_transcript_is_the_last_fifty_messages_and_no_lead_is_null(receiver):
    turns = [turn("s", "h2", n, f"message {n}") for n in range(1, 61)]
    node = handoff_notifier.make_node(ClaimsInMemory(handoff_key), to(receiver.url))
    await decide(node, handoff(turns[-1]), *turns)
    payload = json.loads(receiver.requests[0]["body"])
    assert [m["content"] for m in payload["transcript"]] == [f"message {n}" for n in range(11, 61)]
    assert payload["lead_email"] is None


async def test_the_sites_handoff_url_wins_then_its_lead_url_then_the_deployments(receiver):
    """One receiver, three addresses: the recorded target says which one was used."""
    own, leads, deployment = (f"{receiver.url}/{name}" for name in ("handoff", "lead", "deployment"))
    node = handoff_notifier.make_node(ClaimsInMemory(handoff_key), to(deployment))
    cases = [(SiteConfig(handoff=Handoff(webhook_url=own), lead=Lead(webhook_url=leads)), own),
             (SiteConfig(lead=Lead(webhook_url=leads)), leads),
             (SiteConfig(), deployment)]
    for number, (config, expected) in enumerate(cases, start=1):
        request = turn("s", f"h3-{number}", 1, "a person please")
        (recorded,) = (await decide(node, handoff(request), request, config=config)).events
        assert recorded.ok and recorded.target == expected
    assert len(receiver.requests) == 3


async def test_a_handoff_with_no_webhook_configured_is_recorded_as_skipped_and_nothing_is_sent(receiver):
    request = turn("s", "h4", 1, "a person please")
    node = handoff_notifier.make_node(ClaimsInMemory(handoff_key), to(""))
    (recorded,) = (await decide(node, handoff(request), request)).events
    assert recorded.hook == "handoff" and recorded.skipped and not recorded.ok
    assert recorded.error == "no webhook configured" and receiver.requests == []


def test_a_webhook_url_must_be_http_and_old_webhook_records_are_the_leads():
    for field in ("handoff", "lead"):
        with pytest.raises(SiteConfigError) as info:
            validate({field: {"webhook_url": "javascript:alert(1)"}})
        assert [e.field for e in info.value.errors] == [f"{field}.webhook_url"]
    assert validate({"handoff": {"webhook_url": "https://chat.example/hooks/concierge"}}).handoff.webhook_url
    stored = (b'{"type":"webhook_recorded","event_id":"e","site":"s","session_id":"s1","turn":1,"ts":1.0,'
              b'"target":"https://crm.example","ok":true}')
    assert ev.decode(stored).hook == "lead"


def crashing_once(node):
    """The node whose first handling dies after it acted (the webhook sent, its outcome
    stored) and before its events are stored and the message acked: the bus delivers the
    request again."""
    crashed = []

    async def handle(event, inputs, ctx):
        outputs = await node.handle(event, inputs, ctx)
        if not crashed:
            crashed.append(event.event_id)
            raise ConnectionError("process died before its ack")
        return outputs

    return dataclasses.replace(node, handle=handle)


async def recorded(bus, site, count):
    async def found():
        events = [e for e in await events_of(bus, site) if isinstance(e, ev.WebhookRecorded)]
        return events if len(events) >= count else None

    return await wait_for(found, what=f"{count} webhooks recorded")


async def test_one_signed_delivery_per_handoff_request_however_often_it_is_delivered(bus, site, receiver):
    node = handoff_notifier.make_node(webhook_claims.for_handoffs(bus), to(receiver.url))
    runner = await start(bus, isolated(crashing_once(node), site), fast(), configs=SiteConfigs(bus, ttl_s=0))
    first = turn(site, "s1", 1, "I'm ada@example.com, can I talk to a human?")
    requested = handoff(first)
    later = turn(site, "s1", 3, "a person again please")
    again = handoff(later)  # the same conversation asking once more after its first handoff ended
    try:
        for event in (first, ev.follow(first, ev.LeadCaptured, "booking_handler", email="ada@example.com"),
                      requested):
            await bus.publish(event)
        (outcome,) = await recorded(bus, site, 1)
        await bus.publish(later)
        await bus.publish(again)
        outcomes = await recorded(bus, site, 2)
    finally:
        await runner.stop()
    assert runner.stats.retried == 1  # the first request was delivered twice
    assert outcome.ok and outcome.hook == "handoff" and outcome.causation_id == requested.event_id
    assert {o.causation_id for o in outcomes} == {requested.event_id, again.event_id}
    assert receiver.deliveries() == {handoff_id(site, "s1", requested.event_id): 1,
                                     handoff_id(site, "s1", again.event_id): 1}
    delivery = receiver.requests[0]
    payload = Webhook(webhook_secret.derive(DEPLOYMENT_SECRET, site)).verify(delivery["body"], delivery["headers"])
    assert payload["event_id"] == requested.event_id and payload["lead_email"] == "ada@example.com"

    # Delivered once more after its outcome was stored: the same record, nothing sent.
    inputs = await gather(node.needs, requested, JetStreamStore(bus), SiteConfigs(bus, ttl_s=0))
    repeat = await node.handle(requested, inputs, Context(out=bus, node=runner.durable, cause=requested, attempt=3,
                                                          input_seq=inputs.state.last_seq))
    assert len(receiver.requests) == 2
    assert msgspec.structs.replace(repeat[0], ts=outcome.ts, input_seq=outcome.input_seq) == outcome
