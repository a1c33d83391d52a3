"""A visitor's vote on an answer (services/gateway/routes/feedback.py), in process against real
NATS and Redis: the turns voted on are stored as the services would store them (no service
runs), the votes are read back from the conversation's log. Given an answered turn, when the
visitor votes, then one `FeedbackGiven` per vote that changes the turn's latest."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable

import httpx
import pytest

from services.gateway.sessions import SessionTokens
from shared import events as ev
from tests.helpers import events_of, turn
from tests.servers import configure_site
from tests.test_turn_end import running_gateway

SECRET = "feedback-test-secret-0123456789"
ORIGIN = "https://shop.example"
tokens = SessionTokens(SECRET)


@pytest.fixture
async def client(nats_url, redis_url, site, monkeypatch):
    """The gateway (votes not rate limited: RATE_LIMIT_PER_IP_PER_MIN 0), the site allowing ORIGIN."""
    await configure_site(nats_url, site, allowed_origins=[ORIGIN])
    async with running_gateway(nats_url, redis_url, monkeypatch, session_token_secret=SECRET) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            yield http


async def answered(bus, site: str, session: str, number: int, route: str = "ANSWER") -> None:
    """Turn `number` asked, routed, answered and completed, as the services store it."""
    asked = turn(site, session, number, f"question {number}")
    await bus.publish(asked)
    await bus.publish(ev.follow(asked, ev.RouteDecided, "router", route=route, reason="test"))
    await bus.publish(ev.follow(asked, ev.ResponseCompleted, "responder", node="answer_writer",
                                text=f"answer {number}", token_count=2))
    await bus.publish(ev.follow(asked, ev.TurnCompleted, "responder", metadata={"route": route}))


def vote(client, site: str, session: str, number, body: dict | None = None, token: str | None = "own",
         **headers) -> Awaitable[httpx.Response]:
    """POST the vote with the conversation's token (`token="own"`), another one, or none."""
    if token == "own":
        token = tokens.issue(site, session)
    if token is not None:
        headers["X-Session-Token"] = token
    return client.post(f"/v1/sites/{site}/conversations/{session}/turns/{number}/feedback",
                       json=body if body is not None else {"rating": "up"}, headers=headers)


async def votes_of(bus, site: str, session: str) -> list[ev.FeedbackGiven]:
    return [e for e in await events_of(bus, site, session) if isinstance(e, ev.FeedbackGiven)]


def new_session() -> str:
    return f"s{uuid.uuid4().hex[:12]}"


async def test_a_vote_is_stored_once_and_the_same_vote_again_stores_nothing(bus, site, client):
    session = new_session()
    await answered(bus, site, session, 1)
    await answered(bus, site, session, 2)

    first = await vote(client, site, session, 2, {"rating": "up"})
    assert first.status_code == 201, first.text
    assert first.json() == {"turn": 2, "rating": "up", "reason": "", "stored": True, "new": True}
    again = await vote(client, site, session, 2, {"rating": "up"})
    assert again.status_code == 200 and again.json()["new"] is False and again.json()["stored"] is True

    (stored,) = await votes_of(bus, site, session)
    assert (stored.turn, stored.rating, stored.reason, stored.producer) == (2, "up", "", "gateway")
    # The widget offers a vote on an answer its route names, after a reload too.
    view = (await client.get(f"/v1/sites/{site}/conversations/{session}",
                             headers={"X-Session-Token": tokens.issue(site, session)})).json()
    assert [(m["turn"], m["route"], m["rating"]) for m in view["messages"] if m["role"] == "assistant"] == [
        (1, "ANSWER", ""), (2, "ANSWER", "up")]  # and the vote each has, shown pressed again


async def test_a_changed_vote_is_a_new_event_and_the_latest_counts(bus, site, client):
    session = new_session()
    await answered(bus, site, session, 1)

    assert (await vote(client, site, session, 1, {"rating": "up"})).status_code == 201
    down = await vote(client, site, session, 1, {"rating": "down", "reason": "  It did not answer my question. \n"})
    assert down.status_code == 201
    assert down.json() == {"turn": 1, "rating": "down", "reason": "It did not answer my question.", "stored": True,
                           "new": True}
    # The same vote with blanks around its reason is the same vote.
    assert (await vote(client, site, session, 1, {"rating": "down",
                                                  "reason": "It did not answer my question."})).status_code == 200
    # Back to the first vote: a vote of its own (not the first one's message, deduped).
    assert (await vote(client, site, session, 1, {"rating": "up"})).status_code == 201

    votes = await votes_of(bus, site, session)
    assert [(v.rating, v.reason) for v in votes] == [("up", ""), ("down", "It did not answer my question."),
                                                     ("up", "")]
    assert len({v.event_id for v in votes}) == 3
    assert votes[-1].rating == "up"  # the latest counts
    view = (await client.get(f"/v1/sites/{site}/conversations/{session}",
                             headers={"X-Session-Token": tokens.issue(site, session)})).json()
    assert [m["rating"] for m in view["messages"] if m["role"] == "assistant"] == ["up"]


async def test_a_vote_sent_again_while_its_first_try_is_in_flight_is_stored_once(bus, site, client):
    session = new_session()
    await answered(bus, site, session, 1)
    body = {"rating": "down", "reason": "too long"}
    both = await asyncio.gather(*(vote(client, site, session, 1, body) for _ in range(2)))
    assert sorted(r.status_code for r in both) == [200, 201], [r.text for r in both]
    assert [(v.rating, v.reason) for v in await votes_of(bus, site, session)] == [("down", "too long")]


async def test_only_the_conversations_token_votes_and_another_site_learns_nothing(bus, site, client, nats_url):
    session = new_session()
    await answered(bus, site, session, 1)
    other = f"{site}b"
    await configure_site(nats_url, other, allowed_origins=[ORIGIN])

    for token in (None, "v1.1.forged", tokens.issue(site, new_session()), tokens.issue(other, session)):
        refused = await vote(client, site, session, 1, token=token)
        assert refused.status_code == 403 and refused.json()["detail"][0]["field"] == "session_token", token
    # Another site, with the same session id: site A's token opens nothing there, and with a
    # token of its own there is no such conversation (not "someone else's").
    assert (await vote(client, other, session, 1, token=tokens.issue(site, session))).status_code == 403
    assert (await vote(client, other, session, 1, token=tokens.issue(other, session))).status_code == 404
    # An origin the site does not allow.
    assert (await vote(client, site, session, 1, Origin="https://evil.example")).status_code == 403
    assert await votes_of(bus, site, session) == [] and await events_of(bus, other, session) == []

    allowed = await vote(client, site, session, 1, Origin=ORIGIN)
    assert allowed.status_code == 201 and allowed.headers["access-control-allow-origin"] == ORIGIN


async def test_only_an_answered_turn_takes_a_vote(bus, site, client):
    session = new_session()
    await answered(bus, site, session, 1)
    blocked = ev.TurnBlocked(event_id=ev.new_id(), site=site, session_id=session, turn=2, ts=ev.now(),
                             producer="gateway", reason="spam", reply="Please ask something else.", message_chars=5)
    await bus.publish(blocked)
    failed = turn(site, session, 3, "question 3")
    await bus.publish(failed)
    await bus.publish(ev.follow(failed, ev.TurnFailed, "responder", node="answer_writer", reason="LLM down",
                                attempts=3))
    await bus.publish(turn(site, session, 4, "question 4"))  # still being answered

    for number, status, words in ((2, 409, "blocked"), (3, 409, "failed"), (4, 409, "not been answered yet"),
                                  (5, 404, "no turn 5")):
        refused = await vote(client, site, session, number)
        assert refused.status_code == status and words in refused.json()["detail"], (number, refused.text)
    assert (await vote(client, site, session, 0)).status_code == 422
    assert (await vote(client, site, session, "x")).status_code == 422
    nobody = new_session()
    assert (await vote(client, site, nobody, 1, token=tokens.issue(site, nobody))).status_code == 404
    assert await votes_of(bus, site, session) == []


@pytest.mark.parametrize("body, field", [
    ({}, "rating"),
    ({"rating": "meh"}, "rating"),
    ({"rating": None}, "rating"),
    ({"rating": "down", "reason": "x" * 501}, "reason"),
    ({"rating": "down", "reason": 5}, "reason"),
    ({"rating": "up", "comment": "hi"}, "comment"),
    (["up"], None),
])
async def test_a_bad_body_is_422_naming_the_field_and_reaches_nothing(bus, site, client, body, field):
    session = new_session()
    await answered(bus, site, session, 1)
    refused = await vote(client, site, session, 1, body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["field"] == field, refused.json()
    assert await votes_of(bus, site, session) == []


async def test_a_body_that_is_not_json_or_too_large_is_refused(bus, site, client):
    session = new_session()
    await answered(bus, site, session, 1)
    url = f"/v1/sites/{site}/conversations/{session}/turns/1/feedback"
    headers = {"X-Session-Token": tokens.issue(site, session), "content-type": "application/json"}
    assert (await client.post(url, content=b"{nope", headers=headers)).status_code == 422
    huge = b'{"rating": "up", "reason": "' + b"x" * 9000 + b'"}'
    assert (await client.post(url, content=huge, headers=headers)).status_code == 413
    # The longest reason fits, each character escaped.
    longest = b'{"rating": "down", "reason": "' + b"\\u00e9" * 500 + b'"}'
    stored = await client.post(url, content=longest, headers=headers)
    assert stored.status_code == 201 and stored.json()["reason"] == "\u00e9" * 500
    assert len(await votes_of(bus, site, session)) == 1


async def test_votes_are_rate_limited_per_address(bus, site, nats_url, redis_url, monkeypatch):
    """RATE_LIMIT_PER_IP_PER_MIN counts an address's votes (apart from its chat turns): past it,
    429 with Retry-After and nothing stored; another address still votes."""
    await configure_site(nats_url, site)
    session = new_session()
    await answered(bus, site, session, 1)
    address = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    async with running_gateway(nats_url, redis_url, monkeypatch, session_token_secret=SECRET, rate_per_ip_per_min=3,
                               trusted_proxy_hops=1) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            ratings = ("up", "down", "up")
            for rating in ratings:
                ok = await vote(client, site, session, 1, {"rating": rating}, **{"X-Forwarded-For": address})
                assert ok.status_code == 201, ok.text
            limited = await vote(client, site, session, 1, {"rating": "down"}, **{"X-Forwarded-For": address})
            assert limited.status_code == 429 and limited.json()["error"] == "rate_limited"
            assert 1 <= int(limited.headers["retry-after"]) <= 61
            assert [v.rating for v in await votes_of(bus, site, session)] == list(ratings)
            another = f"203.0.113.{uuid.uuid4().int % 250 + 1}"
            elsewhere = await vote(client, site, session, 1, {"rating": "down"}, **{"X-Forwarded-For": another})
            assert elsewhere.status_code == 201


async def test_a_client_cannot_rotate_its_address_without_a_trusted_proxy(bus, site, nats_url, redis_url, monkeypatch):
    """TRUSTED_PROXY_HOPS=0 (no proxy in front): X-Forwarded-For is the client's own writing and
    is not read, not even from a 127.0.0.1 peer (uvicorn's proxy headers are off), so a new
    address in it each time does not escape the per-address limit."""
    await configure_site(nats_url, site)
    session = new_session()
    await answered(bus, site, session, 1)
    async with running_gateway(nats_url, redis_url, monkeypatch, session_token_secret=SECRET, rate_per_ip_per_min=3,
                               trusted_proxy_hops=0) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            statuses = [(await vote(client, site, session, 1, {"rating": ("up", "down")[i % 2]},
                                    **{"X-Forwarded-For": f"198.51.100.{i + 1}"})).status_code for i in range(5)]
    assert statuses[:3] == [201, 201, 201] and statuses[3:] == [429, 429], statuses


async def test_the_origins_union_lists_every_site_even_when_a_key_watch_ends_early(bus, site, nats_url, monkeypatch):
    """The flaky CORS header (issue 54): the union of the sites' origins listed the sites with
    nats-py's `KeyValue.keys()`, a watcher that ends with no key at all when the server has
    sent every key before the client handled the first (its consumer reports nothing
    pending, nothing handled yet). Here that watcher always ends so: the union still holds
    the site's origin, read from the stream's own count of its subjects."""
    from nats.js.errors import NoKeysError
    from nats.js.kv import KeyValue

    from services.gateway.cors import KnownOrigins
    from shared.site_config import SiteConfigs

    async def ended_early(self, filters=None, **kwargs):
        raise NoKeysError

    monkeypatch.setattr(KeyValue, "keys", ended_early)
    await configure_site(nats_url, site, allowed_origins=[ORIGIN])
    configs = SiteConfigs(bus, ttl_s=0)
    assert site in await configs.configured()
    assert ORIGIN in await KnownOrigins(lambda: configs)()
