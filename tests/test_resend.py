"""A message sent again: a client whose try failed in transit (the connection dropped before
the stream's `start` frame, its gateway died) cannot tell whether the turn was started, so
it sends the message again with the same `client_message_id`. The gateway (in process,
real NATS and Redis; a stand-in node answers each turn after a moment) streams the turn
that try started, from its `start`, whichever state it is in; a message whose try never
reached the log starts its turn as usual. One message, one turn."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cli.harness.sse import chat
from shared import events as ev
from shared.node import Node
from tests.helpers import events_of, own, start, unique
from tests.servers import configure_site
from tests.test_turn_end import running_gateway

ANSWER = "Here it is."


@pytest.fixture
async def base_url(nats_url, redis_url, site, monkeypatch):
    await configure_site(nats_url, site)
    async with running_gateway(nats_url, redis_url, monkeypatch, turn_deadline_s=20.0) as url:
        yield url


@pytest.fixture
async def answering(bus, site):
    """Answers every turn of the test's site 0.5 s after it is requested."""

    async def answer(event, inputs, ctx):
        await asyncio.sleep(0.5)
        return [ctx.follow(ev.ResponseCompleted, node="stand_in", text=ANSWER, token_count=0),
                ctx.follow(ev.TurnCompleted, metadata={"route": "ANSWER"})]

    runner = await start(bus, Node(unique("answer"), ("turn_requested",), own(site, answer)))
    yield
    await runner.stop()


async def first_try_cut_after_the_turn_started(client, base_url, payload) -> tuple[str, str]:
    """POST, read up to the `start` frame (the turn is stored), then the connection drops."""
    async with client.stream("POST", f"{base_url}/v1/chat", json=payload) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                return response.headers["x-session-id"], response.headers["x-session-token"]
    raise AssertionError("no start frame")


def kinds(log, kind):
    return [e for e in log if isinstance(e, kind)]


async def test_a_message_sent_again_after_its_turn_started_streams_that_turn(bus, site, base_url, answering):
    async with httpx.AsyncClient(timeout=20) as client:
        first = await chat(client, base_url, {"site": site, "message": "Hello"})
        session, token = first.session_id, first.session_token
        payload = {"site": site, "session_id": session, "session_token": token, "message": "Do you integrate?",
                   "client_message_id": "m-2"}
        await first_try_cut_after_the_turn_started(client, base_url, payload)
        again = await chat(client, base_url, payload)
        assert again.status == 200 and again.start["turn"] == 2, again.body
        assert again.final["type"] == "complete" and again.text == ANSWER
        # Once it ended, the same message again is the same finished turn, replayed.
        replayed = await chat(client, base_url, payload)
        assert replayed.start["turn"] == 2 and replayed.text == ANSWER and replayed.final["type"] == "complete"
        # Another message is another turn.
        following = await chat(client, base_url, {**payload, "message": "And Sage?", "client_message_id": "m-3"})
        assert following.start["turn"] == 3 and following.final["type"] == "complete"
    log = await events_of(bus, site, session)
    assert [(e.turn, e.client_message_id) for e in kinds(log, ev.TurnRequested)] == [(1, None), (2, "m-2"), (3, "m-3")]


async def test_a_message_sent_again_while_its_first_try_still_streams_gets_the_same_turn(bus, site, base_url,
                                                                                        answering):
    """The guard is held by the turn the first try started (its gateway, or a proxy, still
    has that stream open): no 429, the same turn."""
    async with httpx.AsyncClient(timeout=20) as client:
        payload = {"site": site, "message": "Hello", "client_message_id": "m-1"}
        async with client.stream("POST", f"{base_url}/v1/chat", json=payload) as response:
            session, token = response.headers["x-session-id"], response.headers["x-session-token"]
            again = await chat(client, base_url, {**payload, "session_id": session, "session_token": token})
        assert again.status == 200 and again.start["turn"] == 1, again.body
        assert again.final["type"] == "complete" and again.text == ANSWER
    assert len(kinds(await events_of(bus, site, session), ev.TurnRequested)) == 1


async def test_a_blocked_message_sent_again_gets_the_same_reply(bus, site, base_url):
    async with httpx.AsyncClient(timeout=20) as client:
        first = await chat(client, base_url, {"site": site, "message": "Hello"})
        payload = {"site": site, "session_id": first.session_id, "session_token": first.session_token,
                   "message": "x" * 15_001, "client_message_id": "long-1"}
        blocked = await chat(client, base_url, payload)
        again = await chat(client, base_url, payload)
    assert blocked.final["metadata"]["blocked"] == "length"
    assert again.start["turn"] == blocked.start["turn"] == 2 and again.events == blocked.events
    assert len(kinds(await events_of(bus, site, first.session_id), ev.TurnBlocked)) == 1


async def test_a_message_whose_try_never_reached_the_log_starts_its_turn(bus, site, base_url, answering):
    """Its gateway died before storing it: nothing in the log carries its id."""
    async with httpx.AsyncClient(timeout=20) as client:
        first = await chat(client, base_url, {"site": site, "message": "Hello", "client_message_id": "m-1"})
        sent = await chat(client, base_url, {"site": site, "session_id": first.session_id,
                                             "session_token": first.session_token, "message": "Hello again",
                                             "client_message_id": "m-2"})
    assert sent.start["turn"] == 2 and sent.final["type"] == "complete"
