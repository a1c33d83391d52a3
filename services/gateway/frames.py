"""A turn's server-sent events as they go on the wire, on sse-starlette.

    : keepalive                 a comment, every SSE_KEEPALIVE_S while the stream is open
    id: 3:0                     <turn>:<n>, n counting the turn's frames from 0
    data: {"type": "start", "session_id": ..., "turn": 3, "session_token": ...}

Frame n is the same frame whoever sends it: the live relay and a resume run the same
state machine (relay.py) over the same tokens, so a client that lost the connection after
frame n asks for what follows n (`Last-Event-ID: 3:n`) and gets no gap and no duplicate.
"""

from __future__ import annotations

import json
from typing import AsyncIterable, Iterable

from sse_starlette import EventSourceResponse, ServerSentEvent

from services.gateway.schemas import RequestError

SEP = "\n"  # the widget and the harness split frames on a blank line
KEEPALIVE_S = 15.0
# On SIGTERM a stream gets this long to end by itself (below uvicorn's 30 s graceful
# shutdown in main.py); one cut after that is resumed by the client on another replica.
SHUTDOWN_GRACE_S = 25.0


def event_id(turn: int, n: int) -> str:
    return f"{turn}:{n}"


def last_event_id(header: str | None, turn: int) -> int:
    """The n of the last frame the client has (`<turn>:<n>`), -1 when it has none."""
    if not header:
        return -1
    got_turn, sep, got_n = header.partition(":")
    if not sep or not got_turn.isdigit() or not got_n.isdigit() or len(got_n) > 9:
        raise RequestError("last-event-id", f"expected <turn>:<n>, got {header[:40]!r}", status=400)
    if int(got_turn) != turn:
        raise RequestError("last-event-id", f"{header!r} is an id of turn {got_turn}, not of turn {turn}", status=400)
    return int(got_n)


def start(session_id: str, turn: int, session_token: str) -> dict:
    """Frame 0: which conversation and turn this is, so a client that loses the stream
    knows what to resume (and with which token)."""
    return {"type": "start", "session_id": session_id, "turn": turn, "session_token": session_token}


class Numbering:
    """Numbers a turn's payloads as they go out and holds back those the client already
    has (n <= `after`)."""

    def __init__(self, turn: int, after: int = -1, first: int = 0):
        self.turn, self.after, self.next = turn, after, first

    def encode(self, payloads: Iterable[dict]) -> bytes:
        out = []
        for payload in payloads:
            n, self.next = self.next, self.next + 1
            if n > self.after:
                out.append(frame(payload, event_id(self.turn, n)))
        return b"".join(out)


def frame(payload: dict, id: str) -> bytes:
    return ServerSentEvent(json.dumps(payload, ensure_ascii=False), id=id, sep=SEP).encode()


def response(body: AsyncIterable[bytes], headers: dict[str, str], keepalive_s: float) -> EventSourceResponse:
    """The stream, with a keepalive comment every `keepalive_s` (so no proxy times an idle
    turn out) and `X-Accel-Buffering: no` (so none holds tokens back)."""
    return EventSourceResponse(
        body, headers={"Cache-Control": "no-cache", **headers}, sep=SEP, ping=keepalive_s,
        ping_message_factory=lambda: ServerSentEvent(comment="keepalive", sep=SEP),
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )
