"""A simulated visitor's turn, as the widget (services/gateway/static/widget.js) takes it,
over cli/harness/sse.py: what the visitors of `concierge cluster-rehearsal` and `concierge
chaos` do (cli/measure/rehearsal/cluster.py says what they ask, and how many they are).

- Each message gets an id (`client_message_id`) and is sent.
- A try that started nothing (no connection, 409, 429 `turn_in_progress`, 503), or whose
  connection ended before the turn's `start` frame, is sent again with the same id: if it
  had started the turn (its gateway stored it, then died), the gateway streams that turn.
- A stream cut after its `start` frame is resumed after the last frame read
  (`GET …/turns/{turn}/stream`, `Last-Event-ID`); a turn resumed to its `complete` counts as
  completed, as it does for a widget's visitor.
- Tries are made again after the widget's pauses (every second at first, 30 s in all);
  after the last one the visitor sees an error: `refused` (the message could not be sent) or `cut` (the stream could
  not be resumed).

Where the widget talks to one address (a load balancer picks a live gateway), `ask` is given
the gateways and goes to the next one with each try.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import httpx

from cli.harness.sse import ChatResult, chat, resume

RETRY_PAUSES_S = (1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 5.0, 5.0, 10.0)  # the widget's RETRY_PAUSES_MS
ENDS = ("complete", "error")


@dataclass
class Turn:
    session: int
    message: str
    outcome: str = ""  # complete, error, cut, refused, hung
    status: int | None = None  # the last try's HTTP status (None: no answer)
    turn: int | None = None  # the conversation's turn number, once a `start` frame named it
    retries: int = 0  # tries made again: the message sent again, or the stream resumed
    resumed: int = 0  # of those, resumes of a cut stream
    started: float = 0.0  # time.monotonic() when first sent
    seconds: float = 0.0  # until the visitor saw it end (or gave up)
    message_id: str = ""  # its `client_message_id`, the same on every try
    route: str = ""  # the route its `complete` named (HANDOFF: a person of the team has it)


@dataclass
class Visitor:
    """One visitor's conversation: its id and token, as the widget keeps them."""

    index: int
    session_id: str | None = None
    session_token: str | None = None
    turns: list[Turn] = field(default_factory=list)


def _retry_worthy(read: ChatResult, turn: Turn) -> bool:
    """Whether another try may help: nothing answered, or an answer that says nothing started
    (a message) or the gateway could not serve the stream for now (a resume)."""
    if read.status in (0, 200):
        return True
    if turn.turn is not None:
        return read.status >= 500
    return read.status in (409, 503) or (read.status == 429 and (read.body or {}).get("error") == "turn_in_progress")


async def ask(client: httpx.AsyncClient, site: str, gateways: list[str], first: int, visitor: Visitor, turn: Turn,
              hang_s: float) -> None:
    """One turn, tried as the widget tries it, to its `complete` or `error` or until the
    pauses are spent; `turn` says how it went. `hang_s`: the longest a try may take."""
    turn.started = time.monotonic()
    turn.message_id = message_id = uuid.uuid4().hex
    last_event_id: str | None = None
    gateway, pauses = first, iter(RETRY_PAUSES_S)
    while True:
        read = ChatResult()
        try:
            if turn.turn is None:
                payload = {"site": site, "session_id": visitor.session_id, "session_token": visitor.session_token,
                           "message": turn.message, "client_message_id": message_id}
                await asyncio.wait_for(chat(client, gateways[gateway], payload, into=read), hang_s)
            else:
                await asyncio.wait_for(resume(client, gateways[gateway], site, visitor.session_id, turn.turn,
                                              visitor.session_token, last_event_id, into=read), hang_s)
        except (asyncio.TimeoutError, httpx.ReadTimeout):
            turn.outcome = "hung"
        except httpx.TransportError:
            pass  # no connection (nothing was sent), or it broke: `read` has what came
        turn.status = read.status or None
        if read.session_id and read.session_token:
            visitor.session_id, visitor.session_token = read.session_id, read.session_token
        if read.start is not None:
            turn.turn = read.start["turn"]
        last_event_id = read.last_event_id or last_event_id
        if read.final is not None and read.final["type"] in ENDS:
            turn.outcome = read.final["type"]
            turn.route = (read.final.get("metadata") or {}).get("route") or ""
        if turn.outcome:
            break
        pause = next(pauses, None) if _retry_worthy(read, turn) else None
        if pause is None:
            turn.outcome = "refused" if turn.turn is None else "cut"
            break
        turn.retries += 1
        turn.resumed += turn.turn is not None
        gateway = (gateway + 1) % len(gateways)
        await asyncio.sleep(pause)
    turn.seconds = time.monotonic() - turn.started
