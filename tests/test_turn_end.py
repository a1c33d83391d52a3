"""A turn ends only in the log, and a next turn never overlaps an unfinished one: the gateway
(in process, real NATS and Redis, no other service, so no turn is ever answered) stores a
`TurnFailed` when its relay gives up at the deadline, refuses a session's next turn while
the last one may still end, and ends an overdue one itself before starting the next."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import uvicorn

from cli.harness.sse import chat
from cli.harness.supervisor import free_port
from services.gateway import app as gateway
from services.gateway.settings import GatewaySettings
from shared import events as ev
from shared.config import BusConfig
from tests.helpers import events_of, wait_for
from tests.servers import configure_site

DEADLINE_S = 1.0


@contextlib.asynccontextmanager
async def running_gateway(nats_url: str, redis_url: str, monkeypatch):
    monkeypatch.setattr(gateway, "OVERDUE_MARGIN_S", 0.5)
    port = free_port()
    settings = GatewaySettings(bus=BusConfig(url=nats_url), redis_url=redis_url, turn_deadline_s=DEADLINE_S,
                               rate_per_ip_per_min=0, session_token_secret="turn-end-test-secret-0123456789")
    server = uvicorn.Server(uvicorn.Config(gateway.create_app(settings),
                                           host="127.0.0.1", port=port, log_level="warning"))
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
        async with client.stream("POST", f"{base_url}/v1/chat", json={"site": site, "message": "Hi"}) as response:
            session, token = response.headers["x-session-id"], response.headers["x-session-token"]
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    break  # the start frame: the turn is stored; the visitor leaves
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
