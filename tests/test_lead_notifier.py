"""lead_notifier. Given-when-then, no bus (claims in memory, a real HTTP receiver): what
the webhook tells the receiver of the conversation, and a lead with nowhere to go. Against a
real JetStream: Standard Webhooks signatures a receiver can verify (and reject when
tampered or replayed late), one secret per site, and one delivery per lead whatever copies
of its event the bus carries."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit
import time

import msgspec
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from cli.measure.rehearsal.cluster import duplicate_deliveries
from services.responder import lead_notifier, webhook_claims, webhooks
from services.responder.webhook_claims import Outcome, lead_id
from services.responder.settings import LeadSettings
from shared import events as ev
from shared import subjects, webhook_secret
from shared.node import Context, gather
from shared.site_config import Lead, SiteConfig, SiteConfigs
from shared.store import JetStreamStore
from shared.web import Outbound
from shared.webhook_secret import WebhookSecrets
from tests.servers import WebhookReceiver
from tests.helpers import ClaimsInMemory, decide, events_of, fast, isolated, start, turn, wait_for

DEPLOYMENT_SECRET = "deployment-secret"


@pytest.fixture
def receiver():
    server = WebhookReceiver()
    yield server
    server.close()


def to(receiver, secrets=WebhookSecrets(deployment=DEPLOYMENT_SECRET)) -> LeadSettings:
    """Leads POSTed to `receiver`, signed with `secrets`, retried without waiting long."""
    return LeadSettings(webhook_url=receiver.url, backoff_s=0.01, secrets=secrets,
                        outbound=Outbound(allowed=(urlsplit(receiver.url).netloc,)))


def lead(site, session="s1", turn=2, email="ada@example.com"):
    return ev.LeadCaptured(event_id=ev.new_id(), site=site, session_id=session, turn=turn, ts=ev.now(),
                           producer="test", email=email)


async def test_the_webhook_tells_the_receiver_the_booking_answers_and_the_visitor_profile(receiver):
    request = turn("s", "l1", 1, "Book a demo, I'm ada@example.com, we are 11-50")
    given = [request, ev.follow(request, ev.BookingProgressed, "booking_handler", pending_field=None,
                                collected={"email": "ada@example.com", "team_size": "11-50"}, done=True),
             ev.follow(request, ev.EnrichmentCompleted, "enrichment", profile=ev.VisitorProfile(company_name="Globex"))]
    captured = ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")
    node = lead_notifier.make_node(ClaimsInMemory(), to(receiver))
    recorded, analytics = (await decide(node, captured, *given)).events
    assert isinstance(recorded, ev.WebhookRecorded) and recorded.ok and recorded.target == receiver.url
    assert isinstance(analytics, ev.AnalyticsRecorded) and not analytics.sent  # no analytics API configured
    (delivered,) = receiver.requests
    payload = json.loads(delivered["body"])
    assert payload["collected"] == {"email": "ada@example.com", "team_size": "11-50"}
    assert payload["visitor_profile"]["company_name"] == "Globex" and payload["event_id"] == captured.event_id
    assert payload["transcript"] == [{"role": "user", "content": request.message, "turn": 1}]


async def test_the_lead_carries_the_company_domain_and_the_person_the_site_knows_to_the_webhook_and_analytics(
        receiver):
    """Issue 43: the site's page said who the visitor is (`person_id`): the lead webhook and the
    analytics event tie the lead to them, and both carry the company's domain."""
    request = turn("s", "l2", 1, "I'm ada@globex.example", visitor={"person_id": "crm-0042"})
    given = [request, ev.follow(request, ev.EnrichmentCompleted, "enrichment",
                                profile=ev.VisitorProfile(company_name="Globex", company_domain="globex.example"))]
    captured = ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@globex.example")
    settings = msgspec.structs.replace(to(receiver), posthog_host=receiver.url.rsplit("/", 1)[0],
                                       posthog_api_key="phc_test")
    recorded, analytics = (await decide(lead_notifier.make_node(ClaimsInMemory(), settings), captured, *given)).events
    assert recorded.ok and analytics.sent and analytics.ok
    assert analytics.properties["company_domain"] == "globex.example"
    hook, capture = (json.loads(r["body"]) for r in receiver.requests)
    assert (hook["company_domain"], hook["person_id"]) == ("globex.example", "crm-0042")
    assert (capture["distinct_id"], capture["properties"]["company_domain"]) == ("crm-0042", "globex.example")
    # Nobody the site knows and no company found: the conversation, and no domain.
    receiver.reset()
    anonymous = turn("s", "l3", 1, "I'm bob@example.org")
    lead_of_anonymous = ev.follow(anonymous, ev.LeadCaptured, "booking_handler", email="bob@example.org")
    await decide(lead_notifier.make_node(ClaimsInMemory(), settings), lead_of_anonymous, anonymous)
    hook, capture = (json.loads(r["body"]) for r in receiver.requests)
    assert (hook["company_domain"], hook["person_id"], capture["distinct_id"]) == (None, None, "l3")
    assert "company_domain" not in capture["properties"]


async def test_a_lead_with_no_webhook_configured_is_recorded_as_skipped():
    request = turn("s", "l2", 1, "I'm ada@example.com")
    captured = ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")
    recorded, _ = (await decide(lead_notifier.make_node(ClaimsInMemory()), captured, request)).events
    assert recorded.skipped and not recorded.ok and recorded.error == "no webhook configured"


async def running(bus, site, settings: LeadSettings):
    """The lead_notifier node on a durable of its own, acting on this test's site only."""
    node = lead_notifier.make_node(webhook_claims.for_leads(bus), settings)
    return await start(bus, isolated(node, site), fast(), configs=SiteConfigs(bus, ttl_s=0))


async def recorded(bus, site, count, session="s1"):
    async def found():
        events = [e for e in await events_of(bus, site, session) if isinstance(e, ev.WebhookRecorded)]
        return events if len(events) >= count else None

    return await wait_for(found)


async def test_the_signature_verifies_and_a_tampered_body_or_a_late_replay_fails(bus, site, receiver):
    runner = await running(bus, site, to(receiver))
    try:
        captured = lead(site)
        await bus.publish(captured)
        (outcome,) = await recorded(bus, site, 1)
    finally:
        await runner.stop()
    assert outcome.ok and outcome.attempts == 1
    (request,) = receiver.requests
    headers, body = request["headers"], request["body"]
    assert headers["webhook-id"] == lead_id(site, "s1")
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
    assert "X-Concierge-Signature" not in headers  # the old unsigned-timestamp scheme is gone

    secret = webhook_secret.derive(DEPLOYMENT_SECRET, site)
    payload = Webhook(secret).verify(body, headers)
    assert payload["email"] == "ada@example.com" and payload["event_id"] == captured.event_id
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"ada@", b"eve@"), headers)
    with pytest.raises(WebhookVerificationError):  # another tenant's key does not verify it
        Webhook(webhook_secret.derive(DEPLOYMENT_SECRET, site + "x")).verify(body, headers)
    # The same request replayed ten minutes later: a valid signature, but for a stale timestamp.
    late = webhooks.signed_headers(Webhook(secret), headers["webhook-id"], body, time.time() - 600)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(body, late)


def test_each_site_has_its_own_secret():
    secrets = WebhookSecrets(deployment=DEPLOYMENT_SECRET)
    demo, other = secrets.for_site("demo", Lead()), secrets.for_site("other", Lead())
    assert demo != other and demo.startswith("whsec_") and len(Webhook(demo)._whsecret) == 32
    assert demo == secrets.for_site("demo", Lead())  # stable: the customer's copy stays valid
    rotated = WebhookSecrets(deployment="rotated")
    assert rotated.for_site("demo", Lead()) != demo  # rotating the deployment secret rotates all derived ones

    own_key = webhook_secret.new()
    own = Lead(webhook_secret_env="LEAD_WEBHOOK_SECRET_DEMO")
    mine = {"LEAD_WEBHOOK_SECRET_DEMO": webhook_secret.bound("demo", own_key)}
    assert WebhookSecrets(variables=mine).for_site("demo", own) == own_key
    # Bound to its site: another site naming the same variable gets nothing, and the message
    # is the same whether the variable is another site's, malformed or unset (no oracle).
    refusals = set()
    for site, variables in (("evil", mine), ("demo", {"LEAD_WEBHOOK_SECRET_DEMO": "demo:hunter2"}),
                            ("demo", {"LEAD_WEBHOOK_SECRET_DEMO": own_key}), ("demo", {})):
        with pytest.raises(webhook_secret.WebhookSecretError) as info:
            WebhookSecrets(deployment=DEPLOYMENT_SECRET, variables=variables).for_site(site, own)
        assert "hunter2" not in str(info.value) and own_key not in str(info.value)
        refusals.add(str(info.value).replace(site, "S"))
    assert len(refusals) == 1 and "S:whsec_" in refusals.pop()
    with pytest.raises(webhook_secret.WebhookSecretError, match="LEAD_WEBHOOK_SECRET is not set"):
        WebhookSecrets().for_site("demo", Lead())


def test_only_variables_written_as_a_sites_secret_are_held(monkeypatch):
    monkeypatch.setenv("ADMIN_TOKEN", "admin-token-" + "x" * 30)
    monkeypatch.setenv("DEMO_WEBHOOK_SECRET", webhook_secret.bound("demo", webhook_secret.new()))
    held = webhook_secret.WebhookSecrets.from_env().variables
    assert "DEMO_WEBHOOK_SECRET" in held and "ADMIN_TOKEN" not in held and "PATH" not in held


def test_the_secrets_are_the_environment_at_start(monkeypatch):
    own_key = webhook_secret.new()
    monkeypatch.setenv("LEAD_WEBHOOK_SECRET", DEPLOYMENT_SECRET)
    monkeypatch.setenv("LEAD_WEBHOOK_SECRET_DEMO", webhook_secret.bound("demo", own_key))
    secrets = webhook_secret.WebhookSecrets.from_env()
    monkeypatch.setenv("LEAD_WEBHOOK_SECRET_DEMO", webhook_secret.bound("demo", webhook_secret.new()))
    assert secrets.for_site("demo", Lead(webhook_secret_env="LEAD_WEBHOOK_SECRET_DEMO")) == own_key
    assert secrets.for_site("demo", Lead()) == webhook_secret.derive(DEPLOYMENT_SECRET, "demo")
    assert own_key not in repr(secrets) and DEPLOYMENT_SECRET not in repr(secrets)


async def test_a_site_naming_its_own_secret_is_signed_with_it(bus, site, receiver):
    own_key = webhook_secret.new()
    secrets = WebhookSecrets(deployment=DEPLOYMENT_SECRET,
                             variables={"LEAD_WEBHOOK_SECRET_T": webhook_secret.bound(site, own_key)})
    kv = await bus.js.key_value(subjects.SITE_CONFIG_BUCKET)
    await kv.put(site, msgspec.json.encode(SiteConfig(lead=Lead(webhook_secret_env="LEAD_WEBHOOK_SECRET_T"))))
    runner = await running(bus, site, to(receiver, secrets))
    try:
        await bus.publish(lead(site))
        (outcome,) = await recorded(bus, site, 1)
    finally:
        await runner.stop()
    assert outcome.ok
    (request,) = receiver.requests
    assert Webhook(own_key).verify(request["body"], request["headers"])["site"] == site
    with pytest.raises(WebhookVerificationError):
        Webhook(webhook_secret.derive(DEPLOYMENT_SECRET, site)).verify(request["body"], request["headers"])


async def test_without_a_secret_nothing_is_sent(bus, site, receiver):
    runner = await running(bus, site, to(receiver, WebhookSecrets()))
    try:
        await bus.publish(lead(site))
        (outcome,) = await recorded(bus, site, 1)
    finally:
        await runner.stop()
    assert not outcome.ok and not outcome.skipped and "LEAD_WEBHOOK_SECRET is not set" in outcome.error
    assert receiver.requests == []


async def test_a_duplicate_lead_with_a_new_event_id_is_posted_once(bus, site, receiver):
    receiver.reset(fail_first=1)  # the first attempt fails: the duplicate must not add a delivery either
    first, copy = lead(site), lead(site, turn=3, email="ada@example.org")  # two booking turns racing
    runner = await running(bus, site, to(receiver))
    try:
        await bus.publish(first)
        await bus.publish(copy)
        outcomes = await recorded(bus, site, 2)
    finally:
        await runner.stop()
    (sent,) = [o for o in outcomes if not o.skipped]
    (skipped,) = [o for o in outcomes if o.skipped]
    assert sent.ok and sent.attempts == 2 and len(receiver.requests) == 2  # one failure retried, one success
    assert sent.uncertain == 0  # a 500 is an answer: the receiver holds no copy of that attempt
    assert skipped.duplicate_of == sent.causation_id  # the skip names the lead's owner
    assert {sent.causation_id, skipped.causation_id} == {first.event_id, copy.event_id}
    ids = {r["headers"]["webhook-id"] for r in receiver.requests}
    assert ids == {lead_id(site, "s1")}
    analytics = [e for e in await events_of(bus, site) if isinstance(e, ev.AnalyticsRecorded)]
    assert len(analytics) == 1  # the lead is counted once too


async def test_a_lead_claimed_but_not_sent_is_sent_once_on_redelivery(bus, site, receiver, monkeypatch):
    """A process that died between claiming and POSTing leaves a claim without an outcome;
    the redelivered event owns that claim and sends, once the dead attempt's lease is over. A
    redelivery after the outcome was stored (the ack was lost) reports it again and sends
    nothing."""
    monkeypatch.setattr(webhook_claims, "LEASE_S", 1.0)
    claims = webhook_claims.for_leads(bus)
    captured = lead(site)
    assert (await claims.claim(site, "s1", captured.event_id)).outcome is None  # the dead process's claim
    runner = await running(bus, site, to(receiver))
    try:
        await bus.publish(captured)
        (outcome,) = await recorded(bus, site, 1)
    finally:
        await runner.stop()
    assert outcome.ok and len(receiver.requests) == 1
    assert outcome.uncertain == 1  # the attempt it took over may have sent it before dying

    node = lead_notifier.make_node(claims, to(receiver))
    inputs = await gather(node.needs, captured, JetStreamStore(bus), SiteConfigs(bus, ttl_s=0))
    again = await node.handle(captured, inputs, Context(out=bus, node=runner.durable, cause=captured, attempt=2,
                                                        input_seq=inputs.state.last_seq))
    assert len(receiver.requests) == 1
    # The same event (the same id: JetStream drops the copy), made from the state as it is now.
    assert again[0] == msgspec.structs.replace(outcome, ts=again[0].ts, input_seq=again[0].input_seq)


async def test_a_second_attempt_waits_for_the_first_ones_outcome_rather_than_send_beside_it(bus, site):
    """The first attempt's process frozen past its ack wait (the chaos run's SIGSTOP): the
    event comes to another replica, which finds its own claim without an outcome and waits
    for it (the lease) instead of sending the lead a second time; the first, resumed, stores
    its outcome and the second reports it."""
    claims = webhook_claims.for_leads(bus)
    captured = lead(site)
    assert (await claims.claim(site, "s1", captured.event_id)).outcome is None  # the first attempt, sending
    second = asyncio.create_task(claims.claim(site, "s1", captured.event_id))
    await asyncio.sleep(0.6)
    assert not second.done()  # waiting, not sending
    sent = Outcome(target="https://crm.example/hook", ok=True, status=200, attempts=1)
    await claims.settle(site, "s1", captured.event_id, sent)
    claim = await asyncio.wait_for(second, 5)
    assert claim.owner == captured.event_id and claim.outcome == sent


async def test_an_outcome_is_stored_when_the_claims_bucket_answers_again(bus, site):
    """The webhook has gone out when its outcome is stored. A bucket whose stream has no
    leader (its server killed: an election) answers the put with no response; failing
    there would send the lead again on the retry (a bounded rehearsal's duplicate
    delivery), so the put is made again until the bucket answers."""
    bucket = f"claims_{site}"
    claims = webhook_claims.for_leads(bus)
    claims.kv = await bus.js.create_key_value(bucket=bucket)
    await bus.js.delete_stream(f"KV_{bucket}")  # no stream answers the bucket's subjects now

    async def back():
        await asyncio.sleep(0.5)
        await bus.js.create_key_value(bucket=bucket)

    returning = asyncio.create_task(back())
    try:
        await claims.settle(site, "s1", "owner", Outcome(target="https://crm.example/hook", ok=True, status=200,
                                                          attempts=1))
        entry = await claims.kv.get(subjects.kv_key(site, "s1"))
        assert msgspec.json.decode(entry.value)["outcome"]["ok"] is True
    finally:
        await returning
        await bus.js.delete_stream(f"KV_{bucket}")


async def test_an_attempt_never_answered_is_counted_uncertain_and_a_connection_never_made_is_not(receiver):
    """The receiver got the first POST but answered after the sender's timeout: the retry
    is a second copy with the same webhook-id, which the outcome owns up to (`uncertain`), so
    an audit tells it from a copy sent twice by mistake. A receiver that could not be reached
    holds nothing: no uncertainty."""
    receiver.slow_first, receiver.slow_s = 1, 1.0
    request = turn("s", "u1", 1, "I'm ada@example.com")
    captured = ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")
    settings = msgspec.structs.replace(to(receiver), timeout_s=0.3)
    recorded, _ = (await decide(lead_notifier.make_node(ClaimsInMemory(), settings), captured, request)).events
    assert recorded.ok and recorded.attempts == 2 and recorded.uncertain == 1, recorded
    deliveries = receiver.deliveries()
    assert deliveries == {lead_id("s", "u1"): 2}
    assert duplicate_deliveries(deliveries, {lead_id("s", "u1"): recorded.uncertain}) == (0, 1)
    assert duplicate_deliveries(deliveries, {}) == (1, 0)  # the same copies with no such attempt on record

    port = urlsplit(receiver.url).port
    receiver.close()  # nothing listens there now
    recorded, _ = (await decide(lead_notifier.make_node(ClaimsInMemory(), settings), captured, request)).events
    assert not recorded.ok and recorded.attempts == settings.attempts and recorded.uncertain == 0, recorded
    assert "cannot connect" in recorded.error and str(port) in recorded.error


async def test_a_sites_webhook_to_a_loopback_or_private_address_is_refused_and_nothing_reaches_it(receiver):
    """The outbound guard (shared/web.py) on a site's webhook URL: the receiver is on 127.0.0.1,
    not allowed here, however the address is spelled; the outcome says why and holds no body,
    and a refusal is not retried. The deployment's own LEAD_WEBHOOK_URL is its operator's,
    not a tenant's: the same receiver there is reached."""
    port = urlsplit(receiver.url).port
    request = turn("s", "l9", 1, "I'm ada@example.com")
    captured = ev.follow(request, ev.LeadCaptured, "booking_handler", email="ada@example.com")
    settings = LeadSettings(backoff_s=0.01, secrets=WebhookSecrets(deployment=DEPLOYMENT_SECRET))
    for host in ("127.0.0.1", "①②⑦.0.0.1", "127。0。0。1", "0x7f.1", "localhost", "[::ffff:127.0.0.1]"):
        site_config = SiteConfig(lead=Lead(webhook_url=f"http://{host}:{port}/hook"))
        node = lead_notifier.make_node(ClaimsInMemory(), settings)  # each spelling sent anew, not the first's outcome
        recorded, _ = (await decide(node, captured, request, config=site_config)).events
        assert not recorded.ok and recorded.status is None and recorded.attempts == 1, host
        assert recorded.error.startswith("refused: "), (host, recorded.error)
        assert "loopback" in recorded.error or "no public address" in recorded.error, (host, recorded.error)
    assert receiver.requests == []
    deployments = msgspec.structs.replace(settings, webhook_url=receiver.url)  # no OUTBOUND_ALLOWED needed
    recorded, _ = (await decide(lead_notifier.make_node(ClaimsInMemory(), deployments), captured, request)).events
    assert recorded.ok and len(receiver.requests) == 1
