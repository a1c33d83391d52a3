"""Human handoff, the operator's side and the visitor's live channel
(services/gateway/routes/handoffs.py, services/gateway/handoffs.py), in process against real
NATS and Redis. No service runs: a turn answered and its `HandoffRequested` are stored as
the responder stores them; what the API does is read back from the conversation's log."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from services.gateway.sessions import SessionTokens
from shared import events as ev
from shared.site_config import Handoff, OperatorAccount
from shared.site_store import key_sha256
from tests.helpers import events_of, turn, unique
from tests.servers import configure_site
from tests.test_turn_end import running_gateway
from tests.test_briefs_api import ADMIN, ORIGIN, SECRET, bearer, key_of

tokens = SessionTokens(SECRET)
ADA_KEY = "ck_{site}_" + "ada" * 16  # a named operator's own key (`concierge sites key --operator`)


def ada_key(site: str) -> str:
    return ADA_KEY.format(site=site)


@pytest.fixture
async def api(nats_url, redis_url, site, monkeypatch):
    """The gateway; the site takes handoffs, with its shared key and Ada Lovelace's own; another
    site with its key, taking none."""
    other = unique("other")
    await configure_site(nats_url, site, operator_key_sha256=[key_sha256(key_of(site))], allowed_origins=[ORIGIN],
                         handoff=Handoff(enabled=True),
                         operators=[OperatorAccount(name="Ada Lovelace", key_sha256=key_sha256(ada_key(site)))])
    await configure_site(nats_url, other, operator_key_sha256=[key_sha256(key_of(other))], allowed_origins=[ORIGIN])
    async with running_gateway(nats_url, redis_url, monkeypatch, admin_token=ADMIN,
                               session_token_secret=SECRET) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, other


async def waiting(bus, site: str, session: str | None = None) -> str:
    """A conversation whose first turn was answered and whose second asked for a person."""
    session = session or f"s-{uuid.uuid4().hex[:10]}"
    first = turn(site, session, 1, "What does it cost?")
    await bus.publish(first)
    await bus.publish(ev.follow(first, ev.ResponseCompleted, "responder", node="answer_writer", text="From 10 EUR.",
                                token_count=3))
    await bus.publish(ev.follow(first, ev.TurnCompleted, "responder", metadata={"route": "ANSWER", "sources": [
        {"n": 1, "title": "Pricing", "url": "https://acme.example/pricing", "snippet": "From 10 EUR", "cited": True}]}))
    second = turn(site, session, 2, "Can I talk to a person?")
    await bus.publish(second)
    await bus.publish(ev.follow(second, ev.HandoffRequested, "responder", reason="visitor_asked"))
    return session


def admin(site: str, session: str, action: str) -> str:
    return f"/v1/admin/sites/{site}/handoffs/{session}/{action}"


async def kinds(bus, site: str, session: str) -> list[str]:
    return [ev.event_type(e) for e in await events_of(bus, site, session) if ev.event_type(e) in ev.HANDOFF_EVENTS]


async def test_the_list_shows_a_waiting_conversation_and_its_visitor(bus, site, api):
    client, _ = api
    session = await waiting(bus, site)
    listed = await client.get(f"/v1/admin/sites/{site}/handoffs", headers=bearer(key_of(site)))
    assert listed.status_code == 200, listed.text
    (row,) = [r for r in listed.json()["handoffs"] if r["session_id"] == session]
    assert row["status"] == "waiting" and row["reason"] == "visitor_asked" and row["operator"] == ""
    assert row["requested_ts"] > 0 and row["interest_score"] == 0
    assert [m["content"] for m in row["messages"]] == ["What does it cost?", "From 10 EUR.", "Can I talk to a person?"]
    assert row["visitor_profile"] == {}  # nothing known yet: unknown fields are left out
    assert row["sources"] == [{"title": "Pricing", "url": "https://acme.example/pricing", "snippet": "From 10 EUR"}]


async def test_the_first_of_concurrent_claims_wins_and_the_other_is_told_who_holds_it(bus, site, api):
    client, _ = api
    for _ in range(4):
        session = await waiting(bus, site)
        answers = await asyncio.gather(*(client.post(admin(site, session, "claim"), json={"operator": name},
                                                     headers=bearer(ADMIN)) for name in ("Ada", "Bob", "Cyd")))
        codes = sorted(a.status_code for a in answers)
        assert codes == [201, 409, 409], [a.text for a in answers]
        winner = next(a.json()["operator"] for a in answers if a.status_code == 201)
        assert {a.json()["holder"] for a in answers if a.status_code == 409} == {winner}
        assert await kinds(bus, site, session) == ["operator_joined"]
        again = await client.post(admin(site, session, "claim"), json={"operator": winner}, headers=bearer(ADMIN))
        assert again.status_code == 200 and again.json()["new"] is False
        assert await kinds(bus, site, session) == ["operator_joined"]


async def test_the_holder_writes_releases_and_a_later_handoff_is_claimed_again(bus, site, api):
    client, _ = api
    session = await waiting(bus, site)
    auth = bearer(key_of(site))
    nobody = await client.post(admin(site, session, "messages"), json={"operator": "Ada", "text": "Hi"}, headers=auth)
    assert nobody.status_code == 409  # waiting: claim it first
    assert (await client.post(admin(site, session, "claim"), json={"operator": "Ada"}, headers=auth)).status_code == 201
    sent = await client.post(admin(site, session, "messages"), json={"operator": "Ada", "text": "Hello, Ada here."},
                             headers=auth)
    assert sent.status_code == 201, sent.text
    other = await client.post(admin(site, session, "messages"), json={"operator": "Bob", "text": "Me too"},
                              headers=auth)
    assert other.status_code == 409 and "Ada" in other.text
    released = await client.post(admin(site, session, "release"), json={"operator": "Ada"}, headers=auth)
    assert released.status_code == 200 and released.json()["outcome"] == "released"
    log = [e for e in await events_of(bus, site, session) if ev.event_type(e) in ev.HANDOFF_EVENTS]
    assert [ev.event_type(e) for e in log] == ["operator_joined", "operator_message", "operator_left",
                                               "handoff_ended"]
    assert log[1].text == "Hello, Ada here." and log[1].operator == "Ada" and log[1].turn == 2
    assert log[3].outcome == "released" and log[3].by == "Ada" and all(e.producer == "gateway" for e in log)
    state = await api_state(client, site, session)
    assert state["handoff"] == {"status": "", "operator": ""}
    # A later handoff of the same conversation: the claim key is free again.
    third = turn(site, session, 3, "A person again, please")
    await bus.publish(third)
    await bus.publish(ev.follow(third, ev.HandoffRequested, "responder", reason="visitor_asked"))
    assert (await client.post(admin(site, session, "claim"), json={"operator": "Bob"}, headers=auth)).status_code == 201


async def test_close_ends_a_held_or_a_waiting_handoff(bus, site, api):
    client, _ = api
    held = await waiting(bus, site)
    await client.post(admin(site, held, "claim"), json={"operator": "Ada"}, headers=bearer(ADMIN))
    refused = await client.post(admin(site, held, "close"), json={"operator": "Bob"}, headers=bearer(ADMIN))
    assert refused.status_code == 409
    closed = await client.post(admin(site, held, "close"), json={"operator": "Ada"}, headers=bearer(ADMIN))
    assert closed.status_code == 200 and closed.json()["outcome"] == "closed"
    assert await kinds(bus, site, held) == ["operator_joined", "operator_left", "handoff_ended"]
    untouched = await waiting(bus, site)
    assert (await client.post(admin(site, untouched, "close"), json={"operator": "Bob"},
                              headers=bearer(ADMIN))).status_code == 200
    assert await kinds(bus, site, untouched) == ["handoff_ended"]
    listed = (await client.get(f"/v1/admin/sites/{site}/handoffs", headers=bearer(ADMIN))).json()["handoffs"]
    assert {held, untouched}.isdisjoint(r["session_id"] for r in listed)


async def test_another_sites_key_finds_nothing_and_bad_bodies_name_the_field(bus, site, api):
    client, other = api
    session = await waiting(bus, site)
    assert (await client.get(f"/v1/admin/sites/{site}/handoffs", headers=bearer(key_of(other)))).status_code == 404
    assert (await client.post(admin(site, session, "claim"), json={"operator": "Eve"},
                              headers=bearer(key_of(other)))).status_code == 404
    assert (await client.post(admin(site, session, "claim"), json={"operator": "Eve"})).status_code == 401
    for path, body, field in (
        ("claim", {"operator": ""}, "operator"),
        ("claim", {"operator": "x" * 65}, "operator"),
        ("claim", {"operator": "Ada\n"}, "operator"),
        ("claim", {"operator": " Ada"}, "operator"),
        ("claim", {}, "operator"),
        ("claim", {"operator": "Ada", "role": "admin"}, "role"),
        ("messages", {"operator": "Ada", "text": ""}, "text"),
        ("messages", {"operator": "Ada", "text": "   "}, "text"),
        ("messages", {"operator": "Ada", "text": "x" * 4001}, "text"),
        ("release", {"operator": 7}, "operator"),
    ):
        answer = await client.post(admin(site, session, path), json=body, headers=bearer(ADMIN))
        assert answer.status_code == 422, (path, body, answer.text)
        assert answer.json()["detail"][0]["field"] == field, (path, body, answer.text)
    garbage = await client.post(admin(site, session, "claim"), content=b"{", headers=bearer(ADMIN))
    assert garbage.status_code == 422
    assert (await client.post(admin(site, "no-such-session", "claim"), json={"operator": "Ada"},
                              headers=bearer(ADMIN))).status_code == 404
    assert await kinds(bus, site, session) == []


async def api_state(client, site: str, session: str) -> dict:
    answer = await client.get(f"/v1/sites/{site}/conversations/{session}",
                              headers={"X-Session-Token": tokens.issue(site, session), "Origin": ORIGIN})
    assert answer.status_code == 200, answer.text
    return answer.json()


async def frames_of(client, site: str, session: str, want: int, last_id: str | None = None,
                    during=None) -> list[tuple[str, dict]]:
    """(id, payload) of the live channel's first `want` frames; `during` is awaited once the
    channel is open (its first byte, a frame or a keep-alive, or its headers)."""
    headers = {"X-Session-Token": tokens.issue(site, session), "Origin": ORIGIN}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    got = []
    async with client.stream("GET", f"/v1/sites/{site}/conversations/{session}/live", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        if during is not None:
            await asyncio.sleep(0.3)  # subscribed and caught up
            await during()
        async for frame in sse(response):
            got.append(frame)
            if len(got) == want:
                break
    return got


async def sse(response):
    """(id, payload) of each server-sent event of an open response, as it comes."""
    event_id = None
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            yield event_id, json.loads(line[5:])


async def test_the_live_channel_sends_operator_frames_and_resumes_after_the_last_id(bus, site, api):
    client, _ = api
    session = await waiting(bus, site)
    auth = bearer(ADMIN)
    await client.post(admin(site, session, "claim"), json={"operator": "Ada"}, headers=auth)

    async def write():
        await client.post(admin(site, session, "messages"), json={"operator": "Ada", "text": "one"}, headers=auth)

    first = await asyncio.wait_for(frames_of(client, site, session, 2, during=write), 10)
    assert [p["type"] for _, p in first] == ["operator_joined", "operator_message"]
    assert first[1][1]["text"] == "one" and first[1][1]["operator"] == "Ada"
    for text in ("two", "three"):
        await client.post(admin(site, session, "messages"), json={"operator": "Ada", "text": text}, headers=auth)
    await client.post(admin(site, session, "release"), json={"operator": "Ada"}, headers=auth)
    # Reconnected after "one": the rest, each once, in order.
    rest = await asyncio.wait_for(frames_of(client, site, session, 4, last_id=first[1][0]), 10)
    assert [(p["type"], p.get("text")) for _, p in rest] == [
        ("operator_message", "two"), ("operator_message", "three"), ("operator_left", None), ("handoff_ended", None)]
    assert rest[3][1]["outcome"] == "released"
    ids = [int(i) for i, _ in first + rest]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    forged = await client.get(f"/v1/sites/{site}/conversations/{session}/live",
                              headers={"X-Session-Token": tokens.issue(site, "someone-else"), "Origin": ORIGIN})
    assert forged.status_code == 403


async def test_the_visitor_view_shows_the_handoff_and_the_operators_messages(bus, site, api):
    client, _ = api
    session = await waiting(bus, site)
    assert (await api_state(client, site, session))["handoff"] == {"status": "waiting", "operator": ""}
    await client.post(admin(site, session, "claim"), json={"operator": "Ada"}, headers=bearer(ADMIN))
    await client.post(admin(site, session, "messages"), json={"operator": "Ada", "text": "Hi, I'm Ada."},
                      headers=bearer(ADMIN))
    view = await api_state(client, site, session)
    assert view["handoff"] == {"status": "held", "operator": "Ada"}
    assert [(m["role"], m["content"]) for m in view["messages"]] == [
        ("user", "What does it cost?"), ("assistant", "From 10 EUR."), ("user", "Can I talk to a person?"),
        ("operator", "Hi, I'm Ada.")]
    assert view["messages"][-1]["operator"] == "Ada"


async def answered(bus, site: str) -> str:
    """A conversation whose one turn was answered: nobody asked for a person."""
    session = f"s-{uuid.uuid4().hex[:10]}"
    first = turn(site, session, 1, "What does it cost?")
    await bus.publish(first)
    await bus.publish(ev.follow(first, ev.ResponseCompleted, "responder", node="answer_writer", text="From 10 EUR.",
                                token_count=3))
    await bus.publish(ev.follow(first, ev.TurnCompleted, "responder", metadata={"route": "ANSWER"}))
    return session


async def test_an_operator_joins_a_conversation_nobody_handed_off_and_the_first_join_wins(bus, site, api):
    client, other = api
    session = await answered(bus, site)
    joins = await asyncio.gather(
        client.post(admin(site, session, "claim"), json={}, headers=bearer(ada_key(site))),
        client.post(admin(site, session, "claim"), json={"operator": "Bob"}, headers=bearer(key_of(site))))
    assert sorted(j.status_code for j in joins) == [201, 409], [j.text for j in joins]
    winner = next(j for j in joins if j.status_code == 201).json()["operator"]
    log = [e for e in await events_of(bus, site, session) if ev.event_type(e) in ("handoff_requested", *ev.HANDOFF_EVENTS)]
    assert [(ev.event_type(e), e.producer) for e in log] == [("handoff_requested", "gateway"),
                                                             ("operator_joined", "gateway")]
    assert log[0].reason == "operator" and log[0].turn == 1 and log[1].operator == winner
    assert (await api_state(client, site, session))["handoff"] == {"status": "held", "operator": winner}
    # A site that takes no handoffs: nobody joins; a conversation that does not exist: 404.
    elsewhere = await answered(bus, other)
    refused = await client.post(admin(other, elsewhere, "claim"), json={"operator": "Eve"}, headers=bearer(key_of(other)))
    assert refused.status_code == 409 and "does not take handoffs" in refused.text
    assert await kinds(bus, other, elsewhere) == []
    for own_log in ("_site", "_triage"):  # the site's own logs are no conversation to join
        await bus.publish(turn(site, own_log, 1, "an event in the site's own log"))
        assert (await client.post(admin(site, own_log, "claim"), json={"operator": "Eve"},
                                  headers=bearer(ADMIN))).status_code == 404


async def test_a_named_operators_key_acts_as_them_and_as_nobody_else(bus, site, api):
    client, _ = api
    session = await waiting(bus, site)
    ada = bearer(ada_key(site))
    # Her key answers handoffs; it changes nothing of the site (no keys of its own making either).
    for method, path in (("PATCH", ""), ("PUT", ""), ("POST", "/keys")):
        refused = await client.request(method, f"/v1/admin/sites/{site}{path}", json={}, headers=ada)
        assert refused.status_code == 403, (method, path, refused.text)
    posing = await client.post(admin(site, session, "claim"), json={"operator": "Bob"}, headers=ada)
    assert posing.status_code == 403 and posing.json()["detail"][0]["field"] == "operator"
    claimed = await client.post(admin(site, session, "claim"), json={}, headers=ada)
    assert claimed.status_code == 201 and claimed.json()["operator"] == "Ada Lovelace"
    sent = await client.post(admin(site, session, "messages"), json={"text": "Ada here."}, headers=ada)
    assert sent.status_code == 201 and sent.json()["operator"] == "Ada Lovelace"
    # The shared key names whoever the request names: not Ada, who holds the conversation.
    shared = await client.post(admin(site, session, "messages"), json={"operator": "Bob", "text": "Hi"},
                               headers=bearer(key_of(site)))
    assert shared.status_code == 409 and "Ada Lovelace" in shared.text
    log = [e for e in await events_of(bus, site, session) if ev.event_type(e) in ev.HANDOFF_EVENTS]
    assert [(ev.event_type(e), e.operator) for e in log] == [("operator_joined", "Ada Lovelace"),
                                                             ("operator_message", "Ada Lovelace")]
    # A key made for a named operator through the API acts as them at once; it makes no keys.
    made = await client.post(f"/v1/admin/sites/{site}/keys", json={"operator": "Cy Young"}, headers=bearer(ADMIN))
    assert made.status_code == 201 and made.json()["operator"] == "Cy Young"
    cy = bearer(made.json()["key"])
    other = await waiting(bus, site)
    for _ in range(50):  # the gateway's copy of the config expires (SITE_CONFIG_TTL_S)
        answer = await client.post(admin(site, other, "claim"), headers=cy)
        if answer.status_code != 401:
            break
        await asyncio.sleep(0.1)
    assert answer.status_code == 201 and answer.json()["operator"] == "Cy Young", answer.text
def feed(site: str) -> str:
    return f"/v1/admin/sites/{site}/handoffs/live"


async def take(frames, want: int) -> list[tuple[str, dict]]:
    return [await asyncio.wait_for(anext(frames), 10) for _ in range(want)]


async def test_the_operators_feed_sends_the_sites_steps_in_order_and_resumes_after_the_last_id(bus, site, api):
    """The inbox's feed: from now without Last-Event-ID, the site's handoff steps and its
    visitors' messages in log order, each with its sequence as its id, none of another site's
    (whose steps are interleaved); reconnected after an id, what followed it, none twice."""
    client, other = api
    before = await waiting(bus, site)  # stored before the feed opened: not in it
    auth = bearer(key_of(site))
    async with client.stream("GET", feed(site), headers=auth) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        frames = sse(response)
        (ready_id, ready), = await take(frames, 1)
        assert ready == {"type": "ready"} and int(ready_id) > 0
        session = await waiting(bus, site)
        theirs = await waiting(bus, other)
        for where, who in ((site, session), (other, theirs)):
            claimed = await client.post(admin(where, who, "claim"), json={"operator": "Ada"}, headers=bearer(ADMIN))
            assert claimed.status_code == 201, claimed.text
        for where, who in ((other, theirs), (site, session)):
            await client.post(admin(where, who, "messages"), json={"operator": "Ada", "text": "secret"},
                              headers=bearer(ADMIN))
        got = await take(frames, 5)
    assert [(p["type"], p["turn"]) for _, p in got] == [
        ("turn_requested", 1), ("turn_requested", 2), ("handoff_requested", 2), ("operator_joined", 2),
        ("operator_message", 2)]
    assert {p["session_id"] for _, p in got} == {session} and before != session
    assert got[2][1]["reason"] == "visitor_asked" and got[3][1]["operator"] == got[4][1]["operator"] == "Ada"
    assert "text" not in got[4][1] and all(p["ts"] > 0 for _, p in got)  # the page reads the list for the text
    ids = [int(i) for i, _ in got]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and ids[0] > int(ready_id)

    await client.post(admin(site, session, "release"), json={"operator": "Ada"}, headers=auth)
    async with client.stream("GET", feed(site), headers={**auth, "Last-Event-ID": got[2][0]}) as response:
        rest = await take(sse(response), 5)
    assert rest[0] == (got[2][0], {"type": "ready"})
    assert rest[1:3] == got[3:5]  # the same frames under the same ids
    assert [p["type"] for _, p in rest[3:]] == ["operator_left", "handoff_ended"]
    assert rest[4][1]["outcome"] == "released" and rest[4][1]["by"] == "Ada"


async def test_the_operators_feed_needs_the_sites_token(site, api):
    client, other = api
    assert (await client.get(feed(site))).status_code == 401
    assert (await client.get(feed(site), headers=bearer(key_of(other)))).status_code == 404
    assert (await client.get(feed(other), headers=bearer(key_of(site)))).status_code == 404
    bad = await client.get(feed(site), headers={**bearer(key_of(site)), "Last-Event-ID": "3:0"})
    assert bad.status_code == 400 and "last-event-id" in bad.text
