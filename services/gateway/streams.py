"""A turn's stream as the visitor receives it: the frames (frames.py) of its relay
(relay.py), of a blocked turn, or of a finished turn read again.

Every stream starts with `start` (the conversation, the turn, its session token) and ends
with one `complete` (carrying the token and only the metadata the widget shows:
visitor_view.py) or one `error`. `resumed` serves a turn's frames again, after the frame the
client names (`Last-Event-ID`): what the resume endpoint answers, and what a message sent
again gets when its first try already started the turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from fastapi import Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse

from shared import events as ev
from shared import logs, subjects
from services.gateway import frames, visitor_view
from services.gateway.errors import NotFound
from services.gateway.relay import TurnRelay, from_log, restart
from services.gateway.turns import end_turn


def sse_headers(session_id: str, session_token: str) -> dict[str, str]:
    return {"X-Session-Id": session_id, "X-Session-Token": session_token}


def for_visitor(payload: dict, session_token: str) -> dict:
    """`complete` carries the conversation's token and only the metadata the widget shows."""
    if payload.get("type") != "complete":
        return payload
    return {**payload, "metadata": visitor_view.public_metadata(payload.get("metadata")),
            "session_token": session_token}


async def relayed(relay: TurnRelay, numbering: frames.Numbering, session_token: str,
                  requested: ev.TurnRequested | None = None, seen: Callable[[list[dict]], None] | None = None,
                  done: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[bytes]:
    """The turn's frames from `start`, as the relay hands them out (`seen` sees each batch).
    However the stream ends (the visitor gone included), a turn the relay gave up on is ended
    in the log (by `requested`, or the TurnRequested the relay saw), the relay closed and
    `done` awaited, none of it cut by the cancellation. A turn that completed has `done`
    awaited before its `complete` goes out: the log has ended the turn, and a client that
    sends its next message the moment it reads `complete` (a suggestion clicked) finds the
    session free, not still held by the turn it has just read the end of."""
    with logs.conversation(relay.site, relay.session_id, relay.turn):
        try:
            if first := numbering.encode([frames.start(relay.session_id, relay.turn, session_token)]):
                yield first
            async for batch in relay.batches():
                if seen is not None:
                    seen(batch)
                if done is not None and batch and batch[-1].get("type") == "complete":
                    with anyio.CancelScope(shield=True):
                        await done()
                    done = None
                if chunk := numbering.encode(for_visitor(payload, session_token) for payload in batch):
                    yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                if (reason := relay.gave_up()) and (requested := requested or relay.requested) is not None:
                    await end_turn(relay.bus, requested, reason)
                await relay.close()
                if done is not None:
                    await done()


def blocked(event: ev.TurnBlocked, session_token: str, keepalive_s: float, after: int = -1) -> EventSourceResponse:
    """A blocked turn streams like any other: `start`, the reply, then `complete` saying why."""
    payloads = [
        frames.start(event.session_id, event.turn, session_token),
        {"type": "token", "content": event.reply},
        {"type": "complete", "session_id": event.session_id, "turn": event.turn,
         "metadata": {"blocked": event.reason, "route": None}, "session_token": session_token},
    ]
    return _once(frames.Numbering(event.turn, after).encode(payloads),
                 sse_headers(event.session_id, session_token), keepalive_s)


async def resumed(request: Request, site: str, session_id: str, turn: int, after: int = -1) -> Response:
    """Turn `turn`'s frames after frame `after` (-1: from `start`), live until it ends; a
    finished turn replays from the log. The caller checked the site and the token."""
    bus = request.app.state.bus
    settings = request.app.state.settings
    state = await request.app.state.store.state(site, session_id)
    record = state.turns.get(turn)
    if record is None:
        raise NotFound(f"no conversation {site}/{session_id} (turn {turn})")
    session_token = request.app.state.tokens.issue(site, session_id)
    headers = sse_headers(session_id, session_token)
    if record.status == "blocked":
        stored = [r.event for r in await bus.read(subjects.conv(site, session_id, "turn_blocked"))
                  if r.event.turn == turn]
        return blocked(stored[0], session_token, settings.keepalive_s, after)
    relay = TurnRelay(bus, site, session_id, turn, settings.turn_deadline_s, settings.turn_stall_s)
    await relay.open()
    try:
        whole = await relay.catch_up()
        if not whole:
            state = await request.app.state.store.state(site, session_id)
            record = state.turns[turn]
    except BaseException:
        await relay.close()
        raise
    if not whole and record.status == "completed":
        # Its tokens are gone: the whole answer from the log, replacing what the client has.
        await relay.close()
        answer = next((m.content for m in state.messages if m.role == "assistant" and m.turn == turn), "")
        payloads = from_log(session_id, turn, answer, record.metadata)
        numbering = frames.Numbering(turn, after)
        if after > 0:
            numbering, payloads = frames.Numbering(turn, after, first=after + 1), [restart(), *payloads]
        else:
            payloads.insert(0, frames.start(session_id, turn, session_token))
        return _once(numbering.encode(for_visitor(p, session_token) for p in payloads), headers, settings.keepalive_s)
    # A resumed turn may have lost its first relay with its gateway: this one ends it in the
    # log as that one would have.
    return frames.response(relayed(relay, frames.Numbering(turn, after), session_token), headers,
                           settings.keepalive_s)


def _once(body: bytes, headers: dict[str, str], keepalive_s: float) -> EventSourceResponse:
    """A stream whose frames are all known: one write."""
    async def stream():
        yield body

    return frames.response(stream(), headers, keepalive_s)
