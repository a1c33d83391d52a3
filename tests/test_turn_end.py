"""A turn ends only in the log, and a next turn never overlaps an unfinished one: the gateway
(in process, real NATS and Redis, no other service, so no turn is ever answered) stores a
`TurnFailed` when its relay gives up at the deadline, refuses a session's next turn while
the last one may still end, and ends an overdue one itself before starting the next.

It also ends a turn that shows no progress for TURN_STALL_S (no event, no token, no node
saying it is at work on it), whichever relay watches it, but not a turn whose node is slow
and says so."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
import uvicorn

from cli.harness.sse import chat, resume
from cli.harness.supervisor import free_port
from services.gateway import app as gateway
from services.gateway import turns
from services.gateway.main import proxy_headers
from services.gateway.settings import GatewaySettings
from shared import events as ev
from shared.config import BusConfig
from shared.node import Node
from tests.helpers import events_of, fast, own, start, unique, wait_for
from tests.servers import configure_site

DEADLINE_S = 1.0
STALL_S = 1.0


@contextlib.asynccontextmanager
async def running_gateway(nats_url: str, redis_url: str, monkeypatch, **over):
    monkeypatch.setattr(turns, "OVERDUE_MARGIN_S", 0.5)
    port = free_port()
    settings = GatewaySettings(**{"bus": BusConfig(url=nats_url), "redis_url": redis_url, "turn_deadline_s": DEADLINE_S,
                                  "rate_per_ip_per_min": 0, "session_token_secret": "turn-end-test-secret-0123456789",
                                  **over})
    server = uvicorn.Server(uvicorn.Config(gateway.create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", proxy_headers=proxy_headers(settings)))
    task = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started, 20, "gateway started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def base_url(nats_url, redis_url, site, monkeypatch):
    await configure_site(nats_url, site)
    async with running_gateway(nats_url, redis_url, monkeypatch) as url:
        yield url


@pytest.fixture
async def stalling_url(nats_url, redis_url, site, monkeypatch):
    """A gateway whose deadline is far off and whose stall timeout is short."""
    await configure_site(nats_url, site)
    async with running_gateway(nats_url, redis_url, monkeypatch, turn_deadline_s=30.0, turn_stall_s=STALL_S) as url:
        yield url


async def leave_at_the_start(client, url: str, site: str) -> tuple[str, str]:
    """Start a turn and go away once its start frame arrives (the turn is stored; the visitor
    leaves, or the connection drops): the session and its token."""
    async with client.stream("POST", f"{url}/v1/chat", json={"site": site, "message": "Hi"}) as response:
        session, token = response.headers["x-session-id"], response.headers["x-session-token"]
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                break
    return session, token


def kinds(events, turn):
    return [ev.event_type(e) for e in events if e.turn == turn]


async def test_a_turn_nothing_answers_ends_in_the_log_at_the_deadline(bus, site, base_url):
    async with httpx.AsyncClient(timeout=10) as client:
        first = await chat(client, base_url, {"site": site, "message": "Anyone there?"})
        assert first.status == 200 and first.final["type"] == "error"
        session = first.session_id
        (failed,) = [e for e in await events_of(bus, site, session) if isinstance(e, ev.TurnFailed)]
        assert failed.node == "gateway" and failed.turn == 1 and "deadline" in failed.reason
        # The turn ended, so the next one starts at once (no guard, no wait).
        second = await chat(client, base_url, {"site": site, "session_id": session,
                                               "session_token": first.session_token, "message": "Hello?"})
        assert second.status == 200 and second.start["turn"] == 2


async def test_a_next_turn_waits_for_an_abandoned_one_then_ends_it_when_overdue(bus, site, base_url):
    async with httpx.AsyncClient(timeout=10) as client:
        session, token = await leave_at_the_start(client, base_url, site)
        follow_up = {"site": site, "session_id": session, "session_token": token, "message": "Still there?"}
        refused = await client.post(f"{base_url}/v1/chat", json=follow_up)
        assert refused.status_code == 429 and refused.json()["error"] == "turn_in_progress"
        assert kinds(await events_of(bus, site, session), 2) == []  # nothing of a second turn was stored
        await asyncio.sleep(DEADLINE_S + 0.6)  # past the deadline and its margin
        later = await chat(client, base_url, follow_up)
        assert later.status == 200 and later.start["turn"] == 2
    log = await events_of(bus, site, session)
    (failed,) = [e for e in log if isinstance(e, ev.TurnFailed) and e.turn == 1]
    assert failed.node == "gateway" and "next request" in failed.reason
    # Turn 1 ended before turn 2 began: no interleaving in the log.
    order = [(e.turn, ev.event_type(e)) for e in log if ev.event_type(e) in ("turn_requested", "turn_failed")]
    assert order.index((1, "turn_failed")) < order.index((2, "turn_requested"))


async def test_a_turn_nobody_works_on_ends_at_the_stall_not_at_the_deadline(bus, site, stalling_url):
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        result = await chat(client, stalling_url, {"site": site, "message": "Anyone there?"})
    assert result.final == {"type": "error", "message": "The assistant stopped answering. Please try again."}
    assert time.monotonic() - started < STALL_S + 3
    (failed,) = [e for e in await events_of(bus, site, result.session_id) if isinstance(e, ev.TurnFailed)]
    assert failed.node == "gateway" and failed.reason.startswith(f"no progress for {STALL_S:g} s")


async def test_a_slow_step_whose_node_says_it_is_at_work_is_not_cut(bus, site, stalling_url):
    """The node takes three stall timeouts to answer (a remote model's first token), saying
    it is at work with each heartbeat (ack_wait / 3 = 0.3 s): the visitor reads the answer."""

    async def slow(event, inputs, ctx):
        await asyncio.sleep(3 * STALL_S)
        return [ctx.follow(ev.ResponseCompleted, node="slow", text="Slow but sure.", token_count=0),
                ctx.follow(ev.TurnCompleted, metadata={"route": "ANSWER"})]

    runner = await start(bus, Node(unique("slow"), ("turn_requested",), own(site, slow)), fast(ack_wait_s=0.9))
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            result = await chat(client, stalling_url, {"site": site, "message": "Take your time"})
    finally:
        await runner.stop()
    assert result.final["type"] == "complete" and result.text == "Slow but sure.", result.events
    assert not [e for e in await events_of(bus, site, result.session_id) if isinstance(e, ev.TurnFailed)]


async def test_a_resumed_turn_nobody_works_on_is_ended_by_the_relay_that_resumed_it(bus, site, stalling_url):
    """Its first relay went away with its visitor (or its gateway): the resumed one ends it."""
    async with httpx.AsyncClient(timeout=10) as client:
        session, token = await leave_at_the_start(client, stalling_url, site)
        again = await resume(client, stalling_url, site, session, 1, token, last_event_id="1:0")
    assert again.status == 200 and again.final["type"] == "error", again.events
    (failed,) = [e for e in await events_of(bus, site, session) if isinstance(e, ev.TurnFailed)]
    assert failed.node == "gateway" and failed.reason.startswith("no progress")
