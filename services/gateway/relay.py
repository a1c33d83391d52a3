"""Relay one turn from the bus to the browser.

The gateway subscribes to the turn's token subject and to the conversation's log
subjects *before* it appends `TurnRequested`, so nothing the turn produces can be
missed. It yields SSE payloads: tokens in order, then exactly one `complete` or one
`error`, and never waits past the turn deadline.

If the responder is redelivered (its process died mid-answer) after tokens of the
first attempt reached the browser, the two attempts' texts would be mixed, so the
relay ends with an `error` instead; the log still holds the completed turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from shared import events as ev
from shared import subjects
from shared.bus import Bus

log = logging.getLogger(__name__)

# After TurnCompleted, how long to wait for tokens still in flight on the other subscription.
TOKEN_GRACE_S = 1.0


class TurnRelay:
    def __init__(self, bus: Bus, site: str, session_id: str, turn: int, deadline_s: float):
        self.bus = bus
        self.site, self.session_id, self.turn = site, session_id, turn
        self.deadline_s = deadline_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self._subs = []

    async def open(self) -> None:
        async def put(msg):
            self.queue.put_nowait(msg)

        nc = self.bus.nc
        self._subs.append(await nc.subscribe(subjects.tokens(self.site, self.session_id, self.turn), cb=put))
        self._subs.append(await nc.subscribe(subjects.conversation(self.site, self.session_id), cb=put))

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()

    async def events(self) -> AsyncIterator[dict]:
        deadline = time.monotonic() + self.deadline_s
        attempt: int | None = None
        sent: list[str] = []
        pending: dict[int, str] = {}
        response: ev.ResponseCompleted | None = None
        completed: ev.TurnCompleted | None = None

        while True:
            now = time.monotonic()
            if completed is not None:
                wait = min(deadline, completed_at + TOKEN_GRACE_S) - now
            else:
                wait = deadline - now
            if wait <= 0:
                if completed is not None:
                    async for payload in self._finish(sent, response, completed):
                        yield payload
                    return
                yield {"type": "error", "message": "The assistant did not answer in time. Please try again."}
                return
            try:
                msg = await asyncio.wait_for(self.queue.get(), wait)
            except asyncio.TimeoutError:
                continue
            try:
                event = ev.decode(msg.data)
            except ev.BadEvent as exc:
                log.error("undecodable event on relay", extra={"subject": msg.subject, "error": str(exc)})
                continue
            if event.turn != self.turn:
                continue

            match event:
                case ev.TokenChunk():
                    if attempt is None:
                        attempt = event.attempt
                    if event.attempt != attempt:
                        if sent:
                            yield _interrupted()
                            return
                        attempt, pending = event.attempt, {}
                    pending[event.index] = event.content
                    while len(sent) in pending:
                        content = pending.pop(len(sent))
                        sent.append(content)
                        yield {"type": "token", "content": content}
                case ev.ResponseCompleted():
                    response = event
                    if sent and attempt is not None and event.attempt != attempt:
                        yield _interrupted()
                        return
                case ev.TurnCompleted():
                    completed = event
                    completed_at = time.monotonic()
                case ev.TurnFailed():
                    log.warning("turn failed", extra={"node": event.node, "reason": event.reason})
                    yield {"type": "error", "message": "Sorry, something went wrong while answering. Please try again."}
                    return
                case _:
                    pass

            if completed is not None and (response is None or len(sent) >= response.token_count):
                async for payload in self._finish(sent, response, completed):
                    yield payload
                return

    async def _finish(self, sent: list[str], response: ev.ResponseCompleted | None, completed: ev.TurnCompleted):
        """Close the stream. Tokens lost on the way are made up from the stored answer."""
        if response is not None:
            so_far = "".join(sent)
            if not response.text.startswith(so_far):
                yield _interrupted()
                return
            if len(response.text) > len(so_far):
                yield {"type": "token", "content": response.text[len(so_far):]}
        yield {"type": "complete", "session_id": self.session_id, "turn": self.turn, "metadata": completed.metadata}


def _interrupted() -> dict:
    return {"type": "error", "message": "The answer was interrupted. Please ask again."}
