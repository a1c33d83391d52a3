"""What a visitor sees when something fails, with the whole system running as processes
(tests/e2e.py): a second request while a turn is in flight, a failing or unavailable LLM, a
responder killed mid-turn, replicas, a visitor who leaves mid-answer, a dead gateway's
guard, a dropped stream resumed after its Last-Event-ID, and (last) the bus going away."""

from __future__ import annotations

import asyncio
import json
import time

from cli.harness.sse import Conversation, chat, read_stream, resume
from tests import e2e
from tests.e2e import DEADLINE_S, SLOW_ANSWER, events_of

system, http, site = e2e.system, e2e.http, e2e.site  # the fixtures (tests/e2e.py)


async def test_second_request_while_a_turn_is_in_flight_gets_429(system, llm, http, site):
    llm.clear()
    visitor = Conversation(http, system.gateway_url, site)
    assert (await visitor.say("first")).final["type"] == "complete"
    llm.fail_next({"inter_token_ms": 100})
    slow = asyncio.create_task(visitor.say("slow"))
    await asyncio.sleep(0.5)
    response = await http.post(f"{system.gateway_url}/v1/chat", json=visitor.payload("again"))
    assert response.status_code == 429
    assert (await slow).final["type"] == "complete"
    after = await visitor.say("now")
    assert after.final["type"] == "complete" and after.final["turn"] == 3


async def test_llm_failure_reaches_the_browser_as_an_error_event(system, llm, http, site):
    llm.clear()
    llm.fail_next({"status": 400})
    started = time.monotonic()
    result = await chat(http, system.gateway_url, {"site": site, "message": "this will fail"})
    assert result.final["type"] == "error" and [e["type"] for e in result.events] == ["error"]
    assert time.monotonic() - started < DEADLINE_S
    llm.fail_next({"break_after": 3})
    broken = await chat(http, system.gateway_url, {"site": site, "message": "this breaks midway"})
    # The three chunks the model sent before it broke, then the error (the chunks batched
    # into token events: the first alone, streaming.TokenBatcher).
    assert [e["type"] for e in broken.events][-1] == "error"
    assert {e["type"] for e in broken.events[:-1]} == {"token"} and broken.text == "You said: this"


async def test_fallback_endpoint_is_used_and_reported(system, llm, fallback_llm, http, site):
    llm.clear(), fallback_llm.clear()
    llm.fail_next({"status": 503}, {"status": 503})  # the primary's first try and its one retry
    result = await chat(http, system.gateway_url, {"site": site, "message": "anyone home?"})
    assert result.final["type"] == "complete" and result.final["metadata"]["fallback_used"] is True
    assert len(fallback_llm.requests()) == 1
    normal = await chat(http, system.gateway_url, {"site": site, "message": "and now?"})
    assert normal.final["metadata"]["fallback_used"] is False


async def test_responder_killed_mid_turn_never_leaves_the_stream_hanging(system, llm, http, site):
    llm.clear()
    llm.fail_next({"inter_token_ms": 150})
    got_token = asyncio.Event()

    async def on_event(event):
        if event["type"] == "token":
            got_token.set()

    visitor = Conversation(http, system.gateway_url, site)
    turn = asyncio.create_task(visitor.say("hello", on_event=on_event))
    await asyncio.wait_for(got_token.wait(), 10)
    system.kill("responder")
    system.start_service("responder")
    started = time.monotonic()
    result = await turn
    assert time.monotonic() - started < DEADLINE_S
    assert result.final["type"] in ("complete", "error")
    assert [e["type"] for e in result.events].count(result.final["type"]) == 1

    # Redelivery finishes the turn in the log, and the session takes its next turn.
    async def completed():
        return [e for e in await events_of(http, system, site, visitor.session_id) if e["type"] == "turn_completed"]

    deadline = time.monotonic() + DEADLINE_S
    while not await completed() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert await completed()
    nxt = await visitor.say("still there?")
    assert nxt.final["type"] == "complete" and nxt.final["turn"] == 2


async def test_replicas_share_a_node_and_answer_each_turn_once(system, http, site):
    system.start_service("responder", name="responder-2")
    await asyncio.sleep(1.0)
    results = await asyncio.gather(*(
        chat(http, system.gateway_url, {"site": site, "message": f"hi {i}"}) for i in range(8)
    ))
    assert all(r.final["type"] == "complete" for r in results)
    for r in results:
        kinds = [e["type"] for e in await events_of(http, system, site, r.session_id)]
        assert kinds.count("response_completed") == 1 and kinds.count("turn_completed") == 1


async def test_client_disconnect_frees_the_guard_and_the_next_turn_waits_for_the_log(system, llm, http, site):
    """A visitor who closes the tab mid-answer frees the session's guard at once, but the next
    turn is refused (429 turn_in_progress) until the log ends the running one: turns never
    overlap; then it goes through."""
    llm.clear()
    llm.fail_next({"inter_token_ms": 200})  # the answer takes a few seconds after the tab closes
    async with http.stream("POST", f"{system.gateway_url}/v1/chat", json={"site": site, "message": "slow one"}) as response:
        again = {"site": site, "session_id": response.headers["x-session-id"],
                 "session_token": response.headers["x-session-token"], "message": "back again"}
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                break  # the start frame: the visitor closes the tab
    refused = await http.post(f"{system.gateway_url}/v1/chat", json=again)
    assert refused.status_code == 429 and refused.json()["error"] == "turn_in_progress"
    deadline = time.monotonic() + 30
    status = 429
    while status == 429 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        status = (await http.post(f"{system.gateway_url}/v1/chat", json=again)).status_code
    assert status == 200


async def test_a_guard_left_by_a_dead_gateway_does_not_lock_the_session(system, http, site):
    """A gateway killed mid-turn leaves the session's guard for its TTL (70 s); once the log
    says the turn ended, the next request takes the guard over instead of answering 429."""
    from shared import subjects
    from shared.bus import connect
    from shared.config import BusConfig

    visitor = Conversation(http, system.gateway_url, site)
    assert (await visitor.say("hello")).final["type"] == "complete"
    bus = await connect(BusConfig(url=system.nats_url), name="test-dead-gateway")
    try:
        await bus.bucket(subjects.SESSION_GUARD_BUCKET).create(
            subjects.kv_key(site, visitor.session_id), f"turn {time.time() - 10:.3f}".encode(), msg_ttl=70)
    finally:
        await bus.close()
    again = await visitor.say("still there?")
    assert again.status == 200 and again.final["type"] == "complete" and again.final["turn"] == 2


# --- resumable streams: ids <turn>:<n>, Last-Event-ID, replay from TOKENS and from the log ----

async def _drop_after(http, system, payload: dict, tokens: int) -> dict:
    """Start a turn and close the connection after `tokens` token frames, as a lost network would."""
    seen = {"text": "", "ids": [], "start": None}
    async with http.stream("POST", f"{system.gateway_url}/v1/chat", json=payload) as response:
        assert response.status_code == 200 and response.headers["x-accel-buffering"] == "no"
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                seen["ids"].append(line[4:])
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "start":
                    seen["start"] = event
                elif event["type"] == "token":
                    seen["text"] += event["content"]
                    tokens -= 1
                    if tokens == 0:
                        break
    return seen


async def test_a_dropped_stream_resumes_after_its_last_event_id_without_gap_or_duplicate(system, llm, http, site):
    llm.clear()
    llm.fail_next({"reply": SLOW_ANSWER, "inter_token_ms": 100})
    seen = await _drop_after(http, system, {"site": site, "message": "What does Tidewise do?"}, tokens=5)
    start = seen["start"]
    assert start["turn"] == 1 and start["session_id"] and start["session_token"]
    assert seen["ids"] == [f"1:{n}" for n in range(len(seen["ids"]))]  # start is 1:0, every frame numbered
    assert 0 < len(seen["text"]) < len(SLOW_ANSWER)  # dropped mid-answer
    rest = await resume(http, system.gateway_url, site, start["session_id"], 1, start["session_token"],
                        last_event_id=seen["ids"][-1])
    assert rest.status == 200 and rest.start is None  # the client has frame 0 already
    assert rest.final["type"] == "complete" and rest.final["session_token"] and rest.final["turn"] == 1
    assert [e["type"] for e in rest.events].count("complete") == 1
    assert seen["text"] + rest.text == SLOW_ANSWER
    assert "visitor_profile" not in rest.final["metadata"]
    # From the start (no Last-Event-ID): every frame again, the same ids, then the end.
    whole = await resume(http, system.gateway_url, site, start["session_id"], 1, start["session_token"])
    assert whole.start == start and whole.text == SLOW_ANSWER and whole.final["type"] == "complete"
    assert whole.last_event_id == rest.last_event_id


async def test_a_finished_turn_replays_from_tokens_and_once_they_are_gone_from_the_log(system, llm, http, site):
    llm.clear()
    llm.fail_next({"reply": SLOW_ANSWER})
    first = await chat(http, system.gateway_url, {"site": site, "message": "What does Tidewise do?"})
    assert first.final["type"] == "complete" and first.text == SLOW_ANSWER
    session, token = first.start["session_id"], first.start["session_token"]
    # Frame 1:1 is the first token (sent alone; the rest come batched, streaming.TokenBatcher).
    after = await resume(http, system.gateway_url, site, session, 1, token, last_event_id="1:1")
    assert [e["type"] for e in after.events][-1] == "complete" and "restart" not in [e["type"] for e in after.events]
    assert first.events[0]["content"] + after.text == SLOW_ANSWER
    assert after.last_event_id == first.last_event_id

    # Past TOKENS' retention: the answer comes from the log, replacing what the client had.
    from shared import subjects
    from shared.bus import connect
    from shared.config import BusConfig
    bus = await connect(BusConfig(url=system.nats_url), name="test-purge")
    try:
        await bus.js.purge_stream(subjects.TOKENS_STREAM, subject=subjects.tokens(site, session, 1))
    finally:
        await bus.close()
    replayed = await resume(http, system.gateway_url, site, session, 1, token, last_event_id="1:1")
    assert [e["type"] for e in replayed.events] == ["restart", "token", "complete"]
    assert replayed.text == SLOW_ANSWER and replayed.final["session_token"]
    assert replayed.final["metadata"]["route"] == first.final["metadata"]["route"]
    fresh = await resume(http, system.gateway_url, site, session, 1, token)
    assert fresh.start["turn"] == 1 and [e["type"] for e in fresh.events] == ["token", "complete"]
    assert fresh.text == SLOW_ANSWER


async def test_resuming_needs_the_conversations_token_and_a_real_turn(system, http, site):
    mine = await chat(http, system.gateway_url, {"site": site, "message": "hello"})
    other = await chat(http, system.gateway_url, {"site": site, "message": "hello too"})
    session = mine.session_id
    url = f"{system.gateway_url}/v1/sites/{site}/conversations/{session}/turns/1/stream"
    assert (await http.get(url)).status_code == 403
    assert (await http.get(url, headers={"X-Session-Token": other.session_token})).status_code == 403
    assert (await http.get(url.replace("/turns/1/", "/turns/2/"),
                           headers={"X-Session-Token": mine.session_token})).status_code == 404
    bad = await http.get(url, headers={"X-Session-Token": mine.session_token, "Last-Event-ID": "2:1"})
    assert bad.status_code == 400 and bad.json()["detail"][0]["field"] == "last-event-id"
    async with http.stream("GET", url, headers={"X-Session-Token": mine.session_token}) as response:
        replay = await read_stream(response)
    assert replay.final["type"] == "complete" and replay.text == mine.text


async def test_bus_outage_is_503_and_not_ready(system, http, site):
    """Last in this module: it stops the module's nats-server."""
    system.kill("nats")
    response = await http.post(f"{system.gateway_url}/v1/chat", json={"site": site, "message": "anyone?"})
    assert response.status_code == 503 and response.json()["error"] == "unavailable"
    assert (await http.get(f"{system.gateway_url}/readyz")).status_code == 503
    # Cross-origin calls too, once the cached site origins are stale: 503, not a 500 from the CORS layer.
    await asyncio.sleep(2.5)
    preflight = await http.options(f"{system.gateway_url}/v1/chat", headers={
        "Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 503, preflight.text
    response = await http.post(f"{system.gateway_url}/v1/chat", json={"site": site, "message": "anyone?"},
                               headers={"Origin": "https://elsewhere.example"})
    assert response.status_code == 503, response.text

