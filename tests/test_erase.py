"""Erasing a visitor: every session sharing their IP hash is redacted, caches are emptied."""

from __future__ import annotations

import pytest

from shared import events as ev
from shared import privacy, redis_client, subjects
from shared.config import BusConfig
from shared.events import LLMCall, VisitorProfile
from shared.store import CachedStore
from cli import erase

KEYS = privacy.PrivacySettings()  # the development IP hash key


async def conversation(bus, site, session, ip):
    digest = KEYS.ip_hash(ip)
    req = ev.TurnRequested(event_id=ev.new_id(), site=site, session_id=session, turn=1, ts=ev.now(),
                           producer="gateway", message="I'm ada@example.com, call me",
                           visitor={"email": "ada@example.com", "reveal": {"company": "Acme"}}, ip_hash=digest)
    events = [
        req,
        ev.follow(req, ev.EnrichmentCompleted, "enrichment",
                  profile=VisitorProfile(company_name="Acme", ip=digest, email="ada@example.com", status="completed")),
        ev.follow(req, ev.LLMCallRecorded, "answer_writer", node="answer_writer",
                  call=LLMCall(role="answer", model="m", base_url="u",
                               messages=[{"role": "user", "content": "I'm ada@example.com, call me"}],
                               response_text="Sure, ada@example.com")),
        ev.follow(req, ev.ResponseCompleted, "answer_writer", node="answer_writer", text="Sure, ada@example.com",
                  token_count=3),
        ev.follow(req, ev.TurnCompleted, "finalize", metadata={"visitor_profile": {"ip": digest, "email": "ada@example.com",
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
    other_ids = await conversation(bus, site, "other", "198.51.100.1")
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
        assert b"ada@example.com" in ev.encode(untouched[0].event)
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
    await conversation(bus, site, "c", "192.0.2.100")
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

    report = await erase.erase(BusConfig(url=nats_url), redis_url, site, ["ada"], None)
    assert set(report["sessions"]) == {"ada"}
    assert set(report["mentions"]) == {"bob", ev.TRIAGE_SESSION}
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
