"""Erasing a visitor: every session tied to them (IP hash, the site's person id, e-mail) is
redacted, every other copy of their identity deleted, and nothing of anyone else touched."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError, NotFoundError

from shared import events as ev
from shared import insight, privacy, redis_client, subjects
from shared.config import BusConfig
from shared.events import LLMCall, VisitorProfile
from shared.store import CachedStore
from cli import erase

KEYS = privacy.PrivacySettings()  # the development IP hash key


async def conversation(bus, site, session, ip, email="ada@example.com"):
    digest = KEYS.ip_hash(ip)
    req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                           producer="gateway", message=f"I'm {email}, call me",
                           visitor={"email": email, "reveal": {"company": "Acme"}}, ip_hash=digest)
    events = [
        req,
        ev.follow(req, ev.EnrichmentCompleted, "enrichment",
                  profile=VisitorProfile(company_name="Acme", ip=digest, email=email, status="completed")),
        ev.follow(req, ev.LLMCallRecorded, "answer_writer", node="answer_writer",
                  call=LLMCall(role="answer", model="m", base_url="u",
                               messages=[{"role": "user", "content": f"I'm {email}, call me"}],
                               response_text=f"Sure, {email}")),
        ev.follow(req, ev.ResponseCompleted, "answer_writer", node="answer_writer", text=f"Sure, {email}",
                  token_count=3),
        ev.follow(req, ev.TurnCompleted, "finalize", metadata={"visitor_profile": {"ip": digest, "email": email,
                                                                                  "company_name": "Acme"}}),
    ]
    for e in events:
        await bus.publish(e)
    return [e.event_id for e in events]


async def test_erase_visitor_everywhere(bus, nats_url, redis_url, site):
    ip = "192.0.2.77"
    digest = KEYS.ip_hash(ip)
    first_ids = await conversation(bus, site, "first", ip)
    await conversation(bus, site, "second", ip)        # same visitor, later session
    other_ids = await conversation(bus, site, "other", "198.51.100.1", email="bob@example.org")
    redis = redis_client.connect(redis_url)
    try:
        for key in (privacy.raw_ip_key(site, "first"), privacy.cache_key(site, digest),
                    privacy.returning_key(site, digest), privacy.seen_key(site, "second")):
            await redis.set(key, b"x")

        store = CachedStore(bus)
        before = await store.state(site, "first")  # this store now has the fold cached
        report = await erase.erase(BusConfig(url=nats_url), redis_url, site, ["first"], None)
        after = await store.state(site, "first")
        assert len(after.messages) == len(before.messages) == 2 and after.event_count == 5
        assert "ada@example.com" not in after.messages[0].content

        assert set(report["sessions"]) == {"first", "second"}
        assert report["sessions"]["first"]["events_rewritten"] == 5
        assert report["sessions"]["first"]["fields_redacted"] >= 7
        for session in ("first", "second"):
            records = await bus.read(subjects.conversation(site, session))
            blob = b"".join(ev.encode(r.event) for r in records)
            assert b"ada@example.com" not in blob and digest.encode() not in blob
            assert b"Acme" in blob  # the company is not personal data
        kept = await bus.read(subjects.conversation(site, "first"))
        assert [r.event.event_id for r in kept] == first_ids  # same events, same order
        untouched = await bus.read(subjects.conversation(site, "other"))
        assert [r.event.event_id for r in untouched] == other_ids
        assert b"bob@example.org" in ev.encode(untouched[0].event)
        for key in (privacy.raw_ip_key(site, "first"), privacy.cache_key(site, digest),
                    privacy.returning_key(site, digest), privacy.seen_key(site, "second")):
            assert not await redis.exists(key), key
    finally:
        await redis.aclose()


async def test_erase_refuses_a_session_with_a_turn_in_flight(bus, nats_url, redis_url, site):
    await conversation(bus, site, "busy", "192.0.2.8")
    await bus.bucket(subjects.SESSION_GUARD_BUCKET).create(subjects.kv_key(site, "busy"), b"1", msg_ttl=30)
    with pytest.raises(erase.Busy):
        await erase.erase(BusConfig(url=nats_url), redis_url, site, ["busy"], None)


async def test_erase_by_ip_finds_the_visitors_sessions(bus, nats_url, redis_url, site):
    await conversation(bus, site, "a", "192.0.2.99")
    await conversation(bus, site, "b", "192.0.2.99")
    await conversation(bus, site, "c", "192.0.2.100", email="cyd@example.net")
    report = await erase.erase(BusConfig(url=nats_url), redis_url, site, [], "192.0.2.99")
    assert set(report["sessions"]) == {"a", "b"}
    assert report["ip_hashes"][0]["ip_hash"] == KEYS.ip_hash("192.0.2.99")


def test_one_email_pattern_for_redaction_routing_booking_and_form_fields():
    from services.responder import booking, booking_handler, dialog_state_extractor, form_field_extractor
    from services.router import routing

    assert (booking.EMAIL_RE is booking_handler.EMAIL_RE is dialog_state_extractor.EMAIL_RE
            is form_field_extractor.EMAIL_RE is routing.EMAIL_RE is privacy.EMAIL_RE)
    found = [m.group(0) for m in privacy.EMAIL_RE.finditer("ada.l+x@mail.acme.co.uk, bob@acme, eve@acme..com")]
    assert found == ["ada.l+x@mail.acme.co.uk"]
    assert privacy._scrub("write to ada@acme.io") == f"write to {privacy.REDACTED}"


# --- lead briefs -------------------------------------------------------------------------

async def lead_with_brief(bus, site, session, email, similar=()):
    """A captured lead and every step of its brief, as the enricher stores them; `similar`:
    (session, summary) of other leads its brief was compared with."""
    req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                           producer="gateway", message=f"Demo please, I'm {email}", ip_hash=KEYS.ip_hash(session))
    inputs = ev.BriefInputs(
        email=email, capture_context=f"booking form, {email}",
        transcript=[ev.BriefMessage(role="user", content=f"Demo please, I'm {email}", turn=1)],
        profile=VisitorProfile(company_name="Acme", email=email), form_fields={"email": email, "company": "Acme"},
        similar_leads=[ev.SimilarLead(session_id=s, stage="evaluating", priority=5, summary=text)
                       for s, text in similar])
    metadata = ev.BriefMetadata(priority=7, stage="evaluating", estimated_seats=25, confidence=60)
    events = [
        req,
        ev.follow(req, ev.LeadCaptured, "booking_handler", email=email),
        ev.follow(req, ev.BriefGathered, "brief_gatherer", request_id="r", inputs=inputs),
        ev.follow(req, ev.BriefDrafted, "brief_writer", attempt=1, text=f"## Summary\nAcme; write to {email}",
                  metadata=metadata),
        ev.follow(req, ev.BriefEvaluated, "brief_evaluator", attempt=1, verdict="marginal",
                  issues=[f"{email} is quoted twice"]),
        ev.follow(req, ev.BriefCompleted, "brief_writer", request_id="r", brief=f"## Summary\nAcme; write to {email}",
                  metadata=metadata, call_script=f"Hi, is this {email}?", summary=f"Acme ({email}), 25 seats"),
    ]
    for e in events:
        await bus.publish(e)


def triage(site, *items):
    return ev.TriageCompleted(event_id=ev.new_id(), site=site, session_id=ev.TRIAGE_SESSION, turn=0, ts=ev.now(),
                              producer="lead_triage", request_id=ev.new_id(), leads=len(items),
                              items=[ev.TriageItem(session_id=s, classification=c, reason=r) for s, c, r in items])


async def test_erase_covers_the_leads_brief_and_what_other_briefs_and_triages_say_of_it(bus, nats_url, redis_url, site):
    await lead_with_brief(bus, site, "ada", "ada@example.com")
    await lead_with_brief(bus, site, "bob", "bob@example.org",
                          similar=[("ada", "Ada Lovelace of Acme, 25 seats"), ("cyd", "Cyd's shop, 3 seats")])
    first = triage(site, ("ada", "call_first", "Ada Lovelace is ready to buy"), ("bob", "nurture", "Bob is early"))
    second = triage(site, ("bob", "call_first", "Bob is ready now"))
    for e in (first, second):
        await bus.publish(e)
    snapshots = bus.bucket(subjects.SNAPSHOT_BUCKET)
    await snapshots.put(subjects.kv_key(site, "bob"), b"{}")  # bob's state, holding what his brief said of ada

    report = await erase.erase(BusConfig(url=nats_url), redis_url, site, ["ada"], None)
    assert set(report["sessions"]) == {"ada"}
    assert set(report["mentions"]) == {"bob", ev.TRIAGE_SESSION}
    with pytest.raises(KeyNotFoundError):  # bob's snapshot is gone: folded again from his rewritten log
        await snapshots.get(subjects.kv_key(site, "bob"))
    assert report["sessions"]["ada"]["fields_redacted"] == 9  # 2 of the turn, 7 of the lead and its brief
    ada = [r.event for r in await bus.read(subjects.conversation(site, "ada"))]
    assert len(ada) == 6 and b"ada@example.com" not in b"".join(ev.encode(e) for e in ada)
    gathered = next(e for e in ada if isinstance(e, ev.BriefGathered)).inputs
    assert gathered.email == gathered.form_fields["company"] == privacy.REDACTED
    assert gathered.profile.company_name == "Acme"  # the company is not personal data
    done = next(e for e in ada if isinstance(e, ev.BriefCompleted))
    assert privacy.REDACTED in done.brief and privacy.REDACTED in done.call_script and done.metadata.priority == 7

    bob = [r.event for r in await bus.read(subjects.conversation(site, "bob"))]
    gathered = next(e for e in bob if isinstance(e, ev.BriefGathered)).inputs
    similar = {s.session_id: s.summary for s in gathered.similar_leads}
    assert similar == {"ada": privacy.REDACTED, "cyd": "Cyd's shop, 3 seats"}
    assert b"bob@example.org" in b"".join(ev.encode(e) for e in bob)  # another visitor's own data stays
    triages = [r.event for r in await bus.read(subjects.conversation(site, ev.TRIAGE_SESSION))]
    assert [t.event_id for t in triages] == [first.event_id, second.event_id]
    assert [(i.session_id, i.reason) for i in triages[0].items] == \
        [("ada", privacy.REDACTED), ("bob", "Bob is early")]
    assert triages[1].items == second.items

    # A second visitor erased at once: the triage log is rewritten again, and keeps every event.
    report = await erase.erase(BusConfig(url=nats_url), redis_url, site, ["bob"], None)
    assert set(report["mentions"]) == {ev.TRIAGE_SESSION}
    triages = [r.event for r in await bus.read(subjects.conversation(site, ev.TRIAGE_SESSION))]
    assert [t.event_id for t in triages] == [first.event_id, second.event_id]
    assert all(i.reason == privacy.REDACTED for t in triages for i in t.items)


def test_a_turns_copy_of_the_previous_message_is_redacted_like_the_message():
    """TurnRequested.previous repeats the visitor's message before (for the retrieval)."""
    request = ev.TurnRequested(event_id=ev.new_id(), site="s", session_id="x", turn=2, ts=ev.now(),
                               producer="gateway", message="and the price?", previous="I'm ada@example.com, call me")
    redacted, fields = privacy.redact(request)
    assert "ada@example.com" not in redacted.previous and "previous" in fields
    assert redacted.message == "and the price?"


async def test_erase_removes_the_visitors_words_from_their_insight_record(bus, nats_url, redis_url, site):
    from shared import insight

    await conversation(bus, site, "rated", "192.0.2.31")
    vote = ev.FeedbackGiven(event_id=ev.new_id(), site=site, session_id="rated", turn=1, ts=ev.now(),
                            producer="gateway", rating="down", reason="wrong, mail me at ada@example.com (Ada Lovelace)")
    await bus.publish(vote)
    before = await insight.project_session(bus, site, "rated")
    assert before.turns[0].rating == "down" and "Ada Lovelace" in before.turns[0].reason
    await erase.erase(BusConfig(url=nats_url), redis_url, site, ["rated"], None)
    [after] = await insight.Projections(bus).records(site)
    assert after.turns[0].rating == "down" and after.turns[0].reason == privacy.REDACTED
    assert "ada@example.com" not in after.turns[0].question and "ada@example.com" not in str(after)


# --- the identity the widget sends (issue 43): every copy, and nothing of anyone else ------

ADA = {"person_id": "crm-ada-0042", "email_hash": privacy.email_hash("Ada@Example.com"),
       "session_uuid": "sess-uuid-ada-7f3e", "reveal": {"company": "Acme", "domain": "acme.example"},
       "page_url": "https://site.example/pricing?u=crm-ada-0042"}


async def identified(bus, site, session, ip, visitor, email=None):
    """A conversation of a visitor the site knows (`visitor`: the widget's identity), with
    every copy of it the nodes make: the profile, the search, a prompt naming them, the lead
    (`email`) and its analytics, a handoff and an operator's message."""
    digest = KEYS.ip_hash(ip)
    ids = [v for v in (visitor.get("person_id"), visitor.get("session_uuid")) if v]
    req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                           producer="gateway", message=f"Pricing? I'm {email or 'anonymous'}",
                           visitor=visitor, ip_hash=digest)
    events = [
        req,
        ev.follow(req, ev.EnrichmentCompleted, "enrichment",
                  profile=VisitorProfile(company_name="Acme", company_domain="acme.example", ip=digest,
                                         email=email or ev.UNKNOWN, status="completed", source="reveal")),
        ev.follow(req, ev.RetrievalCompleted, "retrieval", query=f"pricing for {email or ''} {' '.join(ids)}",
                  keywords={"low_level": ids}),
        ev.follow(req, ev.LLMCallRecorded, "answer_writer", node="answer_writer",
                  call=LLMCall(role="answer", model="m", base_url="u",
                               messages=[{"role": "system", "content": f"Visitor {' '.join(ids)} from {digest}"}])),
        ev.follow(req, ev.HandoffRequested, "handoff_handler", reason="visitor_asked",
                  detail=f"asked for a person, {' '.join(ids)}"),
        ev.follow(req, ev.OperatorMessage, "gateway", operator="sam", text=f"I will write to {email or 'you'}"),
    ]
    if email:
        events += [ev.follow(req, ev.LeadCaptured, "booking_handler", email=email),
                   ev.follow(req, ev.AnalyticsRecorded, "lead_notifier", event_name="lead_captured",
                             properties={"company_domain": "acme.example"}, sent=True, ok=True)]
    for e in events:
        await bus.publish(e)
    return events


def redis_copies(site, session, digest):
    """Every Redis key holding something of the visitor of `session` (from `digest`)."""
    return [privacy.raw_ip_key(site, session), privacy.seen_key(site, session),
            privacy.cache_key(site, f"session-{session}"), privacy.cache_key(site, digest),
            privacy.returning_key(site, digest)]


async def copies_elsewhere(bus, redis, site, session, digest):
    """The visitor's copies outside the log: Redis, the state snapshot, token chunks, dead
    letters (of the conversation and of its work items)."""
    for key in redis_copies(site, session, digest):
        await redis.set(key, b'{"company_name": "Acme", "email": "ada@example.com"}')
    await bus.bucket(subjects.SNAPSHOT_BUCKET).put(subjects.kv_key(site, session), b"state: crm-ada-0042")
    chunk = ev.TokenChunk(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                          producer="answer_writer", index=0, content="Hello ada@example.com")
    await bus.js.publish(subjects.tokens(site, session, 1), ev.encode(chunk), stream=subjects.TOKENS_STREAM)
    for subject in (subjects.conv(site, session, "turn_requested"), subjects.work(site, session, "brief_requested")):
        await bus.js.publish(subjects.dlq("some_node"), b"crm-ada-0042", stream=subjects.DLQ_STREAM,
                             headers={"Concierge-Subject": subject})


async def still_there(bus, redis, site, session, digest) -> dict:
    """Which of `copies_elsewhere` are still there."""
    info = await bus.js.stream_info(subjects.DLQ_STREAM)
    dead = 0
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(subjects.DLQ_STREAM, seq)
        except NotFoundError:
            continue
        subject = (msg.headers or {}).get("Concierge-Subject", "")
        dead += subject.startswith((f"conv.{site}.{session}.", f"briefs.{site}.{session}."))
    try:
        snapshot = (await bus.bucket(subjects.SNAPSHOT_BUCKET).get(subjects.kv_key(site, session))).value is not None
    except NotFoundError:  # never there, or purged
        snapshot = False
    chunks = [m async for m in bus.read_raw(subjects.session_tokens(site, session), stream=subjects.TOKENS_STREAM)]
    return {"redis": [k for k in redis_copies(site, session, digest) if await redis.exists(k)],
            "snapshot": snapshot, "token_chunks": len(chunks), "dead_letters": dead}


def blob(records) -> bytes:
    return b"".join(ev.encode(r.event) for r in records)


async def test_erase_by_the_sites_person_id_covers_every_copy_and_leaves_other_visitors_and_tenants(
        bus, nats_url, redis_url, site):
    """The site asks to erase the person it knows as crm-ada-0042: their sessions are found by
    that id (another IP), by the e-mail hash the site passed for the address they left (a
    third IP), and every copy of their identity is gone: the widget's identity, IP hashes,
    e-mail and its hash, ids quoted in searches, prompts, handoffs and operators' messages,
    the fold's person_id, the enricher's Redis entries, snapshot, token chunks, dead letters
    and insight record. Another visitor of the site, and the same person on another tenant's
    site, keep all of theirs."""
    other_site = f"{site}o"
    ips = {"a1": "192.0.2.10", "a2": "192.0.2.20", "a3": "192.0.2.30", "b1": "198.51.100.5"}
    digests = {s: KEYS.ip_hash(ip) for s, ip in ips.items()}
    # The page of a1 passed no e-mail hash: a3 is Ada's by the address she left in a1.
    await identified(bus, site, "a1", ips["a1"], {k: v for k, v in ADA.items() if k != "email_hash"},
                     email="ada@example.com")
    await identified(bus, site, "a2", ips["a2"], {"person_id": ADA["person_id"]})
    await identified(bus, site, "a3", ips["a3"], {"email_hash": ADA["email_hash"]})
    bob = await identified(bus, site, "b1", ips["b1"], {"person_id": "crm-bob-0007", "session_uuid": "sess-uuid-bob-1"},
                           email="bob@example.org")
    # Behind a1's office IP: a colleague the site knows as someone else (theirs), and a
    # visitor who said nobody (the IP's, so Ada's, as for an erase by IP).
    cyd = await identified(bus, site, "c1", ips["a1"], {"person_id": "crm-cyd-0009"})
    await identified(bus, site, "x1", ips["a1"], {})
    theirs = await identified(bus, other_site, "a1", ips["a1"], ADA, email="ada@example.com")
    redis = redis_client.connect(redis_url)
    try:
        for s in ips:
            await copies_elsewhere(bus, redis, site, s, digests[s])
        await copies_elsewhere(bus, redis, other_site, "a1", digests["a1"])
        for s in ("a1", "b1"):
            await insight.project_session(bus, site, s)
        store = CachedStore(bus)
        assert (await store.state(site, "a1")).person_id == ADA["person_id"]

        report = await erase.erase(BusConfig(url=nats_url), redis_url, site, [], None,
                                   person_ids=[ADA["person_id"]])

        assert set(report["sessions"]) == {"a1", "a2", "a3", "x1"}
        assert [r.event for r in await bus.read(subjects.conversation(site, "c1"))] == cyd
        for s in ("a1", "a2", "a3"):
            records = await bus.read(subjects.conversation(site, s))
            data = blob(records)
            for copy in (ADA["person_id"], ADA["email_hash"], ADA["session_uuid"], "ada@example.com",
                         "site.example/pricing", *digests.values()):
                assert copy.encode() not in data, (s, copy)
            assert all(r.event.visitor is None for r in records if isinstance(r.event, ev.TurnRequested))
            assert await still_there(bus, redis, site, s, digests[s]) == \
                {"redis": [], "snapshot": False, "token_chunks": 0, "dead_letters": 0}, s
        state = await store.state(site, "a1")
        assert state.person_id == "" and state.visitor_profile.email == privacy.REDACTED
        [record] = [r for r in await insight.Projections(bus).records(site) if r.session_id == "a1"]
        assert "ada@example.com" not in str(record)

        # Another visitor of the site, and the same person on another tenant's site: untouched.
        kept = await bus.read(subjects.conversation(site, "b1"))
        assert [r.event for r in kept] == bob
        assert [r.event for r in await bus.read(subjects.conversation(other_site, "a1"))] == theirs
        full = {"redis": None, "snapshot": True, "token_chunks": 1, "dead_letters": 2}
        for where, s in ((site, "b1"), (other_site, "a1")):
            found = await still_there(bus, redis, where, s, digests[s])
            assert {**found, "redis": None} == full and len(found["redis"]) == 5, (where, s)
        [record] = [r for r in await insight.Projections(bus).records(site) if r.session_id == "b1"]
        assert "bob@example.org" in str(record)

        # Run again: nothing is found by the person's id any more, nothing changes.
        before = {s: blob(await bus.read(subjects.conversation(site, s))) for s in ("a1", "a2", "a3", "b1")}
        again = await erase.erase(BusConfig(url=nats_url), redis_url, site, [], None, person_ids=[ADA["person_id"]])
        assert again["sessions"] == {}
        again = await erase.erase(BusConfig(url=nats_url), redis_url, site, ["a1"], None)
        assert set(again["sessions"]) == {"a1"} and again["sessions"]["a1"]["fields_redacted"] == 0
        assert {s: blob(await bus.read(subjects.conversation(site, s))) for s in before} == before
    finally:
        await redis.aclose()


async def test_erase_by_email_finds_the_sessions_that_gave_it_or_its_hash(bus, nats_url, redis_url, site):
    await identified(bus, site, "lead", "192.0.2.40", {}, email="Ada@Example.com")  # the address, left in a booking
    await identified(bus, site, "known", "192.0.2.41", {"email_hash": ADA["email_hash"]})  # the site's hash of it
    await identified(bus, site, "other", "192.0.2.42", {"email_hash": privacy.email_hash("bob@example.org")})
    report = await erase.erase(BusConfig(url=nats_url), redis_url, site, [], None, emails=["ada@example.com"])
    assert set(report["sessions"]) == {"lead", "known"}


async def test_an_erased_leads_copy_sends_no_webhook_and_no_analytics(bus, nats_url, redis_url, site):
    """The erase stores the log again, so lead_notifier gets the lead once more: nothing of the
    erased visitor may go out again (PostHog would get a second `lead_captured`)."""
    from services.responder import lead_notifier
    from services.responder.settings import LeadSettings
    from tests.helpers import ClaimsInMemory, decide
    from tests.servers import WebhookReceiver

    await identified(bus, site, "a1", "192.0.2.50", ADA, email="ada@example.com")
    await erase.erase(BusConfig(url=nats_url), redis_url, site, ["a1"], None)
    log_ = [r.event for r in await bus.read(subjects.conversation(site, "a1"))]
    [copy] = [e for e in log_ if isinstance(e, ev.LeadCaptured)]
    receiver = WebhookReceiver()
    try:
        settings = LeadSettings(webhook_url=receiver.url, backoff_s=0.01,
                                posthog_host=receiver.url.rsplit("/", 1)[0], posthog_api_key="phc_test")
        decided = await decide(lead_notifier.make_node(ClaimsInMemory(), settings), copy,
                               *[e for e in log_ if e is not copy])
        assert decided.events == [] and receiver.requests == []
    finally:
        receiver.close()


async def test_no_node_handles_the_erased_visitors_copies_and_another_leads_rewritten_log_only_where_pending(
        work_bus, redis_url, site):
    """The erase stores the visitor's log again: no node is handed their copies (an answer
    written again, a model called, a webhook or analytics event sent, for someone erased).
    Another lead's log, rewritten because its brief mentions the visitor, is handed again only
    to the nodes that had not handled the original yet: nothing is done twice, and nothing is
    lost. (A server of its own: other tests' stopped durables
    would hold every original as pending.)"""
    from shared.consumer import ConsumerRunner
    from shared.node import Node
    from tests.helpers import fast, isolated, start, unique, wait_for

    bus, config = work_bus, BusConfig(url=work_bus.config.url)
    seen: dict[str, list[tuple[str, str]]] = {"early": [], "pending": []}

    def watcher(name):
        async def handle(event, inputs, ctx):
            seen[name].append((event.session_id, ev.event_type(event)))
            return []
        return isolated(Node(name=unique(name), consumes=("turn_requested", "brief_gathered"), handle=handle), site)

    async def settled(runner):
        info = await bus.js.consumer_info(subjects.CONV_STREAM, runner.durable)
        return info.num_pending == 0 and info.num_ack_pending == 0

    def lead(session):
        return [(session, "turn_requested"), (session, "brief_gathered")]

    early = await start(bus, watcher("early"))
    pending = None
    try:
        # Every node had handled bob's events: his rewritten log goes to none of them.
        await lead_with_brief(bus, site, "ada", "ada@example.com")
        await lead_with_brief(bus, site, "bob", "bob@example.org", similar=[("ada", "Ada of Acme")])
        await wait_for(lambda: len(seen["early"]) == 4, what="the originals handled")
        await wait_for(lambda: settled(early), what="their acks stored")
        report = await erase.erase(config, redis_url, site, ["ada"], None)
        assert set(report["mentions"]) == {"bob"}
        await asyncio.sleep(0.5)
        assert sorted(seen["early"]) == sorted(lead("ada") + lead("bob"))

        # A node had not handled dan's events yet (its durable stopped): his rewritten log goes
        # to that node, not to the one that had; carl's, erased, to none.
        pending = ConsumerRunner(bus, watcher("pending"), fast(), start_lookback_s=5)
        await bus.js.add_consumer(subjects.CONV_STREAM, pending.consumer_config())
        await lead_with_brief(bus, site, "carl", "carl@example.com")
        await lead_with_brief(bus, site, "dan", "dan@example.org", similar=[("carl", "Carl of Acme")])
        await wait_for(lambda: len(seen["early"]) == 8, what="the originals handled")
        report = await erase.erase(config, redis_url, site, ["carl"], None)
        assert set(report["mentions"]) == {"dan"}
        await pending.start()
        await wait_for(lambda: len(seen["pending"]) >= 4, what="dan's events handled from the copies")
        await asyncio.sleep(0.5)
        # Bob's copies too: the node was made after his erase, within its start lookback, so
        # his events are as new to it as his originals would have been (their headers name
        # only the nodes that had handled them).
        assert sorted(seen["pending"]) == sorted(lead("bob") + lead("dan"))
        assert len(seen["early"]) == 8  # it had handled dan's originals: the copies name it
    finally:
        await early.stop()
        if pending is not None:
            await pending.stop()


def test_an_identifier_equal_to_a_fields_value_leaves_that_field_and_the_erase_goes_on():
    """A visitor's `person_id` "ANSWER" is also a route: the route stays (it holds no free
    text), the identifier is scrubbed from the messages, and nothing raises."""
    from shared import privacy

    asked = ev.TurnRequested(event_id=ev.new_id(), site="s", session_id="c1", turn=1, ts=1.0, producer="gateway",
                             message="My id is ANSWER, call me", visitor={"person_id": "ANSWER"})
    routed = ev.follow(asked, ev.RouteDecided, "intent_router", route="ANSWER", reason="t")
    (message, _), (route, _) = privacy.redact_log([asked, routed])
    assert route.route == "ANSWER" and "ANSWER" not in message.message and message.visitor is None


async def test_erase_scrubs_the_test_cases_made_from_the_visitors_turns_every_version(bus, nats_url, redis_url, site):
    """A test case saved from the visitor's turn (shared/eval_cases.py) holds their message
    and the conversation before it: erasing the visitor scrubs what named them from each of
    the case's versions, and from the runs' copies (a result, the turn it was asked in); a
    case made from another visitor's turn stays as it was."""
    from shared import eval_cases

    await conversation(bus, site, "ada1", "192.0.2.41", email="ada@example.com")
    await conversation(bus, site, "bob1", "192.0.2.42", email="bob@example.org")
    follow_up = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id="ada1", turn=2, ts=ev.now(),
                                 producer="gateway", message="And the price for ada@example.com's team?")
    await bus.publish(follow_up)
    history = [ev.HistoryMessage(role="user", content="I'm ada@example.com, call me"),
               ev.HistoryMessage(role="assistant", content="Sure, ada@example.com")]
    ada = ev.EvalCase(id=eval_cases.case_id(site, "", "ada1", 2), message=follow_up.message, history=history,
                      expect=ev.Expect(intent="LEARN"), from_session="ada1", from_turn=2)
    await eval_cases.save(bus, site, ada, "admin")
    await eval_cases.save(bus, site, msgspec.structs.replace(ada, expect=ev.Expect(route="ANSWER")), "admin")
    bob = ev.EvalCase(id=eval_cases.case_id(site, "", "bob1", 1), message="I'm bob@example.org, call me",
                      expect=ev.Expect(intent="LEARN"), from_session="bob1", from_turn=1)
    await eval_cases.save(bus, site, bob, "admin")
    # A run asked Ada's case: its result and the turn it was asked in copy her words (shared/eval_runs.py).
    from shared import eval_runs

    run = await eval_runs.request(bus, site, "operator", "admin")
    run_id = eval_runs.run_of(run.session_id)
    await bus.publish(ev.follow(run, ev.EvalCaseResult, "eval_runner", key="result-ada", case_id=ada.id, version=2,
                                passed=True, message=ada.message, answer="Yes, ada@example.com."))
    tried = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=eval_runs.try_session(run_id, ada.id), turn=1,
                             ts=ev.now(), producer="eval_runner", message=ada.message)
    await bus.publish(tried)

    report = await erase.erase(BusConfig(url=nats_url), redis_url, site, ["ada1"], None)
    assert list(report["cases"]) == [eval_cases.session_of(ada.id), run.session_id, tried.session_id]
    for session in (run.session_id, tried.session_id):
        logged = msgspec.json.encode([r.event for r in await bus.read(subjects.conversation(site, session))])
        assert b"ada@example.com" not in logged and privacy.REDACTED.encode() in logged, session
    versions = await eval_cases.versions(bus, site, ada.id)
    assert [v.turn for v in versions] == [1, 2]  # every version kept, in order
    text = msgspec.json.encode(versions)
    assert b"ada@example.com" not in text and text.count(privacy.REDACTED.encode()) >= 6
    assert versions[1].case.message == f"And the price for {privacy.REDACTED}'s team?"
    (kept,) = await eval_cases.versions(bus, site, bob.id)
    assert kept.case.message == "I'm bob@example.org, call me"
    current = await eval_cases.current(bus, site)
    assert current[ada.id][0].case.expect.route == "ANSWER" and not current[ada.id][1]
