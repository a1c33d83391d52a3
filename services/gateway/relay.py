"""Relay one turn from the bus to the browser.

The gateway subscribes to the turn's token subject and to the conversation's log
subjects *before* it appends `TurnRequested`, so nothing the turn produces can be
missed. It yields SSE payloads: tokens in order, then exactly one `complete` or one
`error`, and never waits past the turn deadline.

Nor does it wait for a turn nobody works on: its stall clock restarts at every event of the
turn in the log, every token, and every progress marker (a node at work on the turn says
so when it starts and with each heartbeat: shared/consumer.py). When the clock reaches the
stall timeout (`TURN_STALL_S`) the relay gives up with an `error`, and its caller ends the
turn in the log. A dead process's turn is thus ended within seconds when no replica takes it
over (one replica: the replacement may need longer than that to start), while a step that
is merely slow (a remote model's first token, a slow enrichment) keeps its node talking.

If the responder is redelivered (its process died mid-answer) after tokens of the
first attempt reached the browser, the relay sends `restart` (the widget drops the text
shown so far) and goes on with the new attempt, so the visitor reads one coherent answer;
tokens of an older attempt arriving late are ignored.

A resumed stream (a client that lost the connection) runs the same relay: subscribe
first, then queue the turn's stored tokens (the TOKENS stream) and log events ahead of
whatever arrived live meanwhile (`catch_up`). The turn's progress takes each token index
once and the sources once, so what is both stored and live goes out once, in the order
the first stream sent it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

import msgspec

from shared import events as ev
from shared import subjects
from shared.bus import Bus

log = logging.getLogger(__name__)

# After TurnCompleted, how long to wait for tokens still in flight on the other subscription.
TOKEN_GRACE_S = 1.0


class TurnRelay:
    def __init__(self, bus: Bus, site: str, session_id: str, turn: int, deadline_s: float, stall_s: float = 0.0):
        self.bus = bus
        self.site, self.session_id, self.turn = site, session_id, turn
        self.deadline_s = deadline_s
        self.stall_s = stall_s  # 0: no stall clock, only the deadline
        self.queue: asyncio.Queue = asyncio.Queue()
        self._subs = []
        self._progress_subject = subjects.progress(site, session_id, turn)
        self._progress_at = time.monotonic()
        # How the stream ended, for the turn metrics: complete, timeout, stalled, failed or
        # interrupted; None while running (or when the visitor left first).
        self.outcome: str | None = None
        self.requested: ev.TurnRequested | None = None  # the turn's, once seen: what ends it in the log

    async def open(self) -> None:
        async def put(msg):
            self.queue.put_nowait(msg)

        nc = self.bus.nc
        self._subs.append(await nc.subscribe(subjects.tokens(self.site, self.session_id, self.turn), cb=put))
        self._subs.append(await nc.subscribe(subjects.conversation(self.site, self.session_id), cb=put))
        self._subs.append(await nc.subscribe(self._progress_subject, cb=put))

    async def catch_up(self) -> bool:
        """Queue the turn's stored tokens and log events before the live ones (after `open`).

        False when the turn's answer is in the log but its tokens are no longer all in
        TOKENS (past its retention, or the stream was recreated): they can no longer be
        numbered as the first stream numbered them, and the caller replays from the log."""
        tokens = [_Stored(subject, data) async for _, subject, data in self.bus.read_raw(
            subjects.tokens(self.site, self.session_id, self.turn), stream=subjects.TOKENS_STREAM)]
        logged = [_Stored(subject, data) async for _, subject, data in self.bus.read_raw(
            subjects.conversation(self.site, self.session_id))]
        self.prepend(tokens + logged)
        return _tokens_cover_answer(tokens, logged, self.turn)

    def prepend(self, stored: list) -> None:
        """Stored messages go before what the subscriptions queued since they opened (no
        await in between: no message can slip in while the queue is swapped)."""
        live, self.queue = self.queue, asyncio.Queue()
        for msg in stored:
            self.queue.put_nowait(msg)
        while not live.empty():
            self.queue.put_nowait(live.get_nowait())

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()

    async def batches(self) -> AsyncIterator[list[dict]]:
        """Payloads in order, grouped by what had already arrived: under load one write
        carries several tokens instead of one write per token."""
        started = self._progress_at = time.monotonic()
        deadline = started + self.deadline_s
        turn = _TurnProgress()
        while True:
            now = time.monotonic()
            if turn.completed is not None:
                until = min(deadline, turn.completed_at + TOKEN_GRACE_S)
            elif self.stall_s > 0:
                until = min(deadline, self._progress_at + self.stall_s)
            else:
                until = deadline
            wait = until - now
            if wait <= 0:
                if turn.completed is not None:
                    yield self._finish(turn)
                elif now >= deadline:
                    self.outcome = "timeout"
                    yield [{"type": "error", "message": "The assistant did not answer in time. Please try again."}]
                else:
                    self.outcome = "stalled"
                    yield [{"type": "error", "message": "The assistant stopped answering. Please try again."}]
                return
            try:
                msg = await asyncio.wait_for(self.queue.get(), wait)
            except asyncio.TimeoutError:
                continue
            out: list[dict] = []
            done = self._take(msg, turn, out)
            while not done and not self.queue.empty():
                done = self._take(self.queue.get_nowait(), turn, out)
            if not done and turn.ready_to_finish():
                out.extend(self._finish(turn))
                done = True
            if out:
                yield out
            if done:
                return

    def gave_up(self) -> str | None:
        """Why the relay gave up on a turn nothing ended (the caller then ends it in the log
        with this reason), or None when the turn ended or the visitor left."""
        if self.outcome == "timeout":
            return f"no outcome within the turn deadline ({self.deadline_s:g} s)"
        if self.outcome == "stalled":
            return f"no progress for {self.stall_s:g} s (TURN_STALL_S): no event, token or node at work on the turn"
        return None

    def _finish(self, turn: "_TurnProgress") -> list[dict]:
        out = turn.finish(self.session_id, self.turn)
        self.outcome = "complete" if out[-1]["type"] == "complete" else "interrupted"
        return out

    def _take(self, msg, turn: "_TurnProgress", out: list[dict]) -> bool:
        """Fold one bus message into the turn's progress; True when the stream must end."""
        if msg.subject == self._progress_subject:  # a node at work on the turn
            self._progress_at = time.monotonic()
            return False
        if (subjects.in_conversation(msg.subject, self.site, self.session_id)
                and msg.subject.rpartition(".")[2] not in _ACTED_ON):
            # An event the relay only times the turn by: its turn number, not the whole
            # event (a retrieval's documents and an LLM call's prompt are most of a turn's
            # bytes).
            try:
                if _turn_of.decode(msg.data).turn == self.turn:
                    self._progress_at = time.monotonic()
            except msgspec.MsgspecError as exc:
                log.error("undecodable event on relay", extra={"subject": msg.subject, "error": str(exc)})
            return False
        try:
            event = ev.decode(msg.data)
        except ev.BadEvent as exc:
            log.error("undecodable event on relay", extra={"subject": msg.subject, "error": str(exc)})
            return False
        if mismatch := ev.subject_mismatch(event, msg.subject):
            log.error("event on the wrong subject ignored by the relay", extra={"subject": msg.subject, "error": mismatch})
            return False
        if event.turn != self.turn:
            return False
        self._progress_at = time.monotonic()
        match event:
            case ev.TurnRequested():
                self.requested = event
            case ev.TokenChunk():
                if turn.attempt is None:
                    turn.attempt = event.attempt
                if event.attempt < turn.attempt:
                    return False  # a stale attempt's late token
                if event.attempt > turn.attempt:
                    turn.switch_to(event.attempt, out)
                turn.pending[event.index] = event.content
                while len(turn.sent) in turn.pending:
                    content = turn.pending.pop(len(turn.sent))
                    turn.sent.append(content)
                    out.append({"type": "token", "content": content})
            case ev.SourcesAttached():
                if not turn.sent and not turn.sources_sent:  # sources come before the first token, once
                    turn.sources_sent = True
                    out.append({"type": "sources", "sources": event.sources})
            case ev.ResponseCompleted():
                if turn.attempt is not None and event.attempt < turn.attempt:
                    return False  # a stale attempt finishing late: the newer one is shown
                if turn.attempt is not None and event.attempt > turn.attempt:
                    turn.switch_to(event.attempt, out)
                turn.attempt = event.attempt
                turn.response = event
            case ev.TurnCompleted():
                turn.completed = event
                turn.completed_at = time.monotonic()
            case ev.TurnFailed() if turn.completed is None:  # as the fold: a completed turn stays completed
                log.warning("turn failed", extra={"node": event.node, "reason": event.reason})
                self.outcome = "failed"
                out.append({"type": "error", "message": "Sorry, something went wrong while answering. Please try again."})
                return True
        return False


class _TurnOf(msgspec.Struct):
    turn: int


_turn_of = msgspec.json.Decoder(_TurnOf)
# The conversation's event types `_take` acts on; any other event of the turn in the log only
# restarts the stall clock.
_ACTED_ON = {ev.event_type(cls) for cls in (ev.TurnRequested, ev.ResponseCompleted, ev.TurnCompleted, ev.TurnFailed)}


class _TurnProgress:
    def __init__(self):
        self.attempt: int | None = None
        self.sent: list[str] = []
        self.sources_sent = False
        self.pending: dict[int, str] = {}
        self.response: ev.ResponseCompleted | None = None
        self.completed: ev.TurnCompleted | None = None
        self.completed_at = 0.0

    def switch_to(self, attempt: int, out: list[dict]) -> None:
        """A newer attempt of the answer (the responder was redelivered): what the browser
        shows of the older one is replaced."""
        if self.sent:
            out.append(restart())
        self.attempt, self.sent, self.pending = attempt, [], {}

    def ready_to_finish(self) -> bool:
        return self.completed is not None and (self.response is None or len(self.sent) >= self.response.token_count)

    def finish(self, session_id: str, turn: int) -> list[dict]:
        """Close the stream. Tokens lost on the way are made up from the stored answer."""
        out: list[dict] = []
        if self.response is not None:
            so_far = "".join(self.sent)
            if not self.response.text.startswith(so_far):
                return [_interrupted()]
            if len(self.response.text) > len(so_far):
                out.append({"type": "token", "content": self.response.text[len(so_far):]})
        out.append({"type": "complete", "session_id": session_id, "turn": turn, "metadata": self.completed.metadata})
        return out


@dataclass
class _Stored:
    """A stored message, shaped as a delivered one for `_take`."""

    subject: str
    data: bytes


def _tokens_cover_answer(tokens: list[_Stored], logged: list[_Stored], turn: int) -> bool:
    """Whether every token of the turn's stored answer (if it has one yet) is stored."""
    answers = [e for e in _decoded(logged) if isinstance(e, ev.ResponseCompleted) and e.turn == turn]
    if not answers:
        return True
    answer = answers[-1]  # the relay, too, finishes from the last stored answer
    indexes = {e.index for e in _decoded(tokens) if isinstance(e, ev.TokenChunk) and e.attempt == answer.attempt}
    return indexes >= set(range(answer.token_count))


def _decoded(stored: list[_Stored]):
    for msg in stored:
        try:
            yield ev.decode(msg.data)
        except ev.BadEvent:
            continue  # logged when the relay takes it


def from_log(session_id: str, turn: int, text: str, metadata: dict) -> list[dict]:
    """A finished turn whose tokens are gone, as the relay would have sent it: its sources
    (as the widget cites them), the whole answer as one token, `complete`."""
    sources = [{k: v for k, v in s.items() if k != "cited"} for s in metadata.get("sources") or []]
    out: list[dict] = [{"type": "sources", "sources": sources}] if sources else []
    if text:
        out.append({"type": "token", "content": text})
    out.append({"type": "complete", "session_id": session_id, "turn": turn, "metadata": metadata})
    return out


def restart() -> dict:
    """The text shown so far is replaced by what follows."""
    return {"type": "restart"}


def _interrupted() -> dict:
    return {"type": "error", "message": "The answer was interrupted. Please ask again."}
