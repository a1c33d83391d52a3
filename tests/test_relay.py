"""The gateway relay's turn, pure: bus messages in, SSE payloads out, no NATS (the
messages are put on the relay's queue as its subscriptions would). Tokens in order, made
up from the stored answer when some were lost, sources once before the first token, one
`complete` or one `error`; a responder redelivered after tokens went out ends the stream."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from services.gateway import relay
from services.gateway.relay import TurnRelay, _TurnProgress
from shared import events as ev
from shared import subjects
from tests.helpers import turn

SITE, SESSION = "s", "r1"
REQUEST = turn(SITE, SESSION, 1, "Do you integrate with Xero?")


@dataclass
class Msg:
    subject: str
    data: bytes


def on_bus(event: ev.Envelope, subject: str | None = None) -> Msg:
    if subject is None:
        on_tokens = isinstance(event, (ev.TokenChunk, ev.SourcesAttached))
        subject = (subjects.tokens(event.site, event.session_id, event.turn) if on_tokens
                   else subjects.conv(event.site, event.session_id, ev.event_type(event)))
    return Msg(subject, ev.encode(event))


def chunk(index: int, content: str, attempt: int = 1, cause: ev.Envelope = REQUEST) -> ev.TokenChunk:
    return ev.follow(cause, ev.TokenChunk, "test", key=f"t{attempt}.{index}", index=index, content=content,
                     attempt=attempt)


def answered(text: str, tokens: int, attempt: int = 1) -> ev.ResponseCompleted:
    return ev.follow(REQUEST, ev.ResponseCompleted, "test", key=f"r{attempt}", node="answer_writer", text=text,
                     token_count=tokens, attempt=attempt)


COMPLETED = ev.follow(REQUEST, ev.TurnCompleted, "test", metadata={"route": "ANSWER"})
COMPLETE = {"type": "complete", "session_id": SESSION, "turn": 1, "metadata": {"route": "ANSWER"}}


async def relayed(*messages: Msg, deadline_s: float = 5.0) -> list[list[dict]]:
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s)
    for msg in messages:
        turn_relay.queue.put_nowait(msg)
    return [batch async for batch in turn_relay.batches()]


async def test_tokens_in_order_after_the_sources_then_complete():
    sources = ev.follow(REQUEST, ev.SourcesAttached, "test", sources=[{"n": 1, "title": "Integrations"}])
    batches = await relayed(on_bus(sources), on_bus(chunk(1, " syncs")), on_bus(chunk(0, "Xero")),
                            on_bus(answered("Xero syncs", 2)), on_bus(COMPLETED))
    assert batches == [[{"type": "sources", "sources": [{"n": 1, "title": "Integrations"}]},
                        {"type": "token", "content": "Xero"}, {"type": "token", "content": " syncs"}, COMPLETE]]


async def test_tokens_lost_on_the_way_are_made_up_from_the_stored_answer(monkeypatch):
    monkeypatch.setattr(relay, "TOKEN_GRACE_S", 0.05)
    batches = await relayed(on_bus(chunk(0, "Xero")), on_bus(answered("Xero syncs", 2)), on_bus(COMPLETED))
    assert sum(batches, []) == [{"type": "token", "content": "Xero"}, {"type": "token", "content": " syncs"}, COMPLETE]


async def test_sources_after_the_first_token_are_not_sent():
    sources = ev.follow(REQUEST, ev.SourcesAttached, "test", sources=[{"n": 1}])
    batches = await relayed(on_bus(chunk(0, "Hi")), on_bus(sources), on_bus(answered("Hi", 1)), on_bus(COMPLETED))
    assert sum(batches, []) == [{"type": "token", "content": "Hi"}, COMPLETE]


async def test_a_second_attempt_after_tokens_went_out_restarts_the_text():
    """The responder died mid-answer and a replica answers again: the browser is told to drop
    the first attempt's text and reads the second one whole; the first's late tokens are ignored."""
    batches = await relayed(on_bus(chunk(0, "Xero")), on_bus(chunk(0, "Yes", attempt=2)),
                            on_bus(chunk(1, " stale", attempt=1)), on_bus(chunk(1, ", it syncs", attempt=2)),
                            on_bus(answered("Yes, it syncs", 2, attempt=2)), on_bus(COMPLETED))
    assert sum(batches, []) == [{"type": "token", "content": "Xero"}, {"type": "restart"},
                                {"type": "token", "content": "Yes"}, {"type": "token", "content": ", it syncs"},
                                COMPLETE]


async def test_the_second_attempts_answer_alone_replaces_what_was_shown(monkeypatch):
    """Its tokens lost on the way: the stored answer of the new attempt is made up whole."""
    monkeypatch.setattr(relay, "TOKEN_GRACE_S", 0.05)
    batches = await relayed(on_bus(chunk(0, "Xero")), on_bus(answered("Yes, it syncs", 2, attempt=2)),
                            on_bus(answered("Xero syncs", 2, attempt=1)), on_bus(COMPLETED))
    assert sum(batches, []) == [{"type": "token", "content": "Xero"}, {"type": "restart"},
                                {"type": "token", "content": "Yes, it syncs"}, COMPLETE]


async def test_a_second_attempt_before_any_token_went_out_replaces_the_first():
    batches = await relayed(on_bus(chunk(1, " lost")), on_bus(chunk(0, "Yes", attempt=2)),
                            on_bus(answered("Yes", 1, attempt=2)), on_bus(COMPLETED))
    assert sum(batches, []) == [{"type": "token", "content": "Yes"}, COMPLETE]


async def test_a_failed_turn_ends_with_an_error():
    failed = ev.follow(REQUEST, ev.TurnFailed, "test", node="answer_writer", reason="boom", attempts=3)
    batches = await relayed(on_bus(chunk(0, "Xe")), on_bus(failed))
    assert batches[-1][-1] == {"type": "error",
                               "message": "Sorry, something went wrong while answering. Please try again."}


async def test_other_turns_wrong_subjects_and_garbage_are_ignored_until_the_deadline():
    later = turn(SITE, SESSION, 2, "and Sage?")
    batches = await relayed(on_bus(chunk(0, "other turn", cause=later)),
                            on_bus(chunk(0, "elsewhere"), subject=subjects.tokens("other", SESSION, 1)),
                            Msg(subjects.tokens(SITE, SESSION, 1), b"not an event"), deadline_s=0.2)
    assert batches == [[{"type": "error", "message": "The assistant did not answer in time. Please try again."}]]


# --- the stall clock: a turn nobody works on ends; one a node is at work on goes on ---------

STALLED = {"type": "error", "message": "The assistant stopped answering. Please try again."}


def at_work(turn_relay: TurnRelay, seconds: float, then: list[Msg] = ()) -> asyncio.Task:
    """A node saying it is at work on turn 1 every 0.1 s for `seconds`, then `then` on the bus."""
    marker = Msg(subjects.progress(SITE, SESSION, 1), b"answer_writer")

    async def step():
        for _ in range(round(seconds / 0.1)):
            turn_relay.queue.put_nowait(marker)
            await asyncio.sleep(0.1)
        for msg in then:
            turn_relay.queue.put_nowait(msg)

    return asyncio.create_task(step())


async def test_a_turn_nothing_progresses_ends_at_the_stall_and_says_why_for_the_log():
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s=5.0, stall_s=0.2)
    turn_relay.queue.put_nowait(on_bus(REQUEST))
    started = time.monotonic()
    assert [batch async for batch in turn_relay.batches()] == [[STALLED]]
    assert 0.2 <= time.monotonic() - started < 1.0
    assert turn_relay.outcome == "stalled" and turn_relay.requested == REQUEST
    assert turn_relay.gave_up().startswith("no progress for 0.2 s")


async def test_a_node_at_work_on_the_turn_keeps_the_stall_clock_from_running():
    """Three stall timeouts of a slow step (a remote model's first token), then the answer."""
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s=5.0, stall_s=0.2)
    step = at_work(turn_relay, 0.6, [on_bus(chunk(0, "Hi")), on_bus(answered("Hi", 1)), on_bus(COMPLETED)])
    batches = [batch async for batch in turn_relay.batches()]
    await step
    assert sum(batches, []) == [{"type": "token", "content": "Hi"}, COMPLETE]
    assert turn_relay.gave_up() is None


async def test_the_turns_own_tokens_are_progress_and_another_turns_are_not():
    later = turn(SITE, SESSION, 2, "and Sage?")
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s=10.0, stall_s=0.5)

    async def answer():
        for msg in (on_bus(chunk(0, "Hi")), on_bus(chunk(1, " there"))):
            turn_relay.queue.put_nowait(msg)
            await asyncio.sleep(0.3)
        for i in range(40):  # 4 s of another turn's answer
            turn_relay.queue.put_nowait(on_bus(chunk(i, "other turn", cause=later)))
            await asyncio.sleep(0.1)

    started = time.monotonic()
    step = asyncio.create_task(answer())
    batches = [batch async for batch in turn_relay.batches()]
    step.cancel()
    assert sum(batches, []) == [{"type": "token", "content": "Hi"}, {"type": "token", "content": " there"}, STALLED]
    assert time.monotonic() - started < 2.5


async def test_a_node_at_work_for_ever_still_ends_at_the_deadline():
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s=0.5, stall_s=0.2)
    step = at_work(turn_relay, 1.0)
    batches = [batch async for batch in turn_relay.batches()]
    step.cancel()
    assert batches == [[{"type": "error", "message": "The assistant did not answer in time. Please try again."}]]
    assert turn_relay.gave_up() == "no outcome within the turn deadline (0.5 s)"


def test_progress_is_ready_once_every_token_of_the_stored_answer_went_out():
    progress = _TurnProgress()
    assert not progress.ready_to_finish()
    progress.completed = COMPLETED
    assert progress.ready_to_finish()  # no answer stored (a blocked or failed reply): nothing to wait for
    progress.response = answered("Xero syncs", 2)
    progress.sent = ["Xero"]
    assert not progress.ready_to_finish()
    progress.sent.append(" syncs")
    assert progress.ready_to_finish() and progress.finish(SESSION, 1) == [COMPLETE]


def test_progress_that_disagrees_with_the_stored_answer_is_interrupted():
    progress = _TurnProgress()
    progress.completed, progress.response, progress.sent = COMPLETED, answered("Yes, it does", 3), ["No"]
    assert progress.finish(SESSION, 1) == [{"type": "error", "message": "The answer was interrupted. Please ask again."}]


# --- resuming: stored messages first, then live ones, each token once -----------------------

async def resumed(stored: list[Msg], live: list[Msg], deadline_s: float = 5.0) -> list[dict]:
    """What a resume relays: the live subscription got `live` first, then the store was read."""
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s)
    for msg in live:
        turn_relay.queue.put_nowait(msg)
    turn_relay.prepend(stored)
    return sum([batch async for batch in turn_relay.batches()], [])


async def test_a_resume_sends_what_is_stored_and_live_once_in_the_first_streams_order():
    sources = ev.follow(REQUEST, ev.SourcesAttached, "test", sources=[{"n": 1}])
    first = await relayed(on_bus(sources), on_bus(chunk(0, "Xero")), on_bus(chunk(1, " syncs")),
                          on_bus(chunk(2, " daily")), on_bus(answered("Xero syncs daily", 3)), on_bus(COMPLETED))
    stored = [on_bus(sources), on_bus(chunk(0, "Xero")), on_bus(chunk(1, " syncs"))]
    live = [on_bus(chunk(1, " syncs")), on_bus(chunk(2, " daily")), on_bus(answered("Xero syncs daily", 3)),
            on_bus(COMPLETED)]
    again = await resumed(stored, live)
    assert again == sum(first, [])
    assert [p["content"] for p in again if p["type"] == "token"] == ["Xero", " syncs", " daily"]


async def test_a_resume_of_a_finished_turn_replays_it_from_the_store():
    stored = [on_bus(chunk(0, "Xero")), on_bus(chunk(1, " syncs")), on_bus(answered("Xero syncs", 2)), on_bus(COMPLETED)]
    assert await resumed(stored, []) == [{"type": "token", "content": "Xero"}, {"type": "token", "content": " syncs"},
                                         COMPLETE]


async def test_a_failure_stored_after_the_turn_completed_does_not_turn_it_into_an_error():
    failed = ev.follow(REQUEST, ev.TurnFailed, "test", node="answer_writer", reason="no TurnRequested", attempts=1)
    got = await resumed([on_bus(chunk(0, "Hi")), on_bus(answered("Hi", 1)), on_bus(COMPLETED), on_bus(failed)], [])
    assert got == [{"type": "token", "content": "Hi"}, COMPLETE]


def test_stored_tokens_cover_the_answer_only_when_every_index_of_its_attempt_is_there():
    logged = [relay._Stored(m.subject, m.data) for m in (on_bus(answered("Xero syncs", 2, attempt=2)),)]

    def tokens(*chunks):
        return [relay._Stored(m.subject, m.data) for m in map(on_bus, chunks)]

    assert relay._tokens_cover_answer(tokens(), [], 1)  # no answer yet: live tokens will come
    assert relay._tokens_cover_answer(tokens(chunk(0, "Xero", 2), chunk(1, " syncs", 2)), logged, 1)
    assert not relay._tokens_cover_answer(tokens(chunk(1, " syncs", 2)), logged, 1)  # the first ones expired
    assert not relay._tokens_cover_answer(tokens(chunk(0, "Xero"), chunk(1, " syncs")), logged, 1)  # another attempt


def test_a_finished_turn_from_the_log_is_its_sources_the_whole_answer_and_complete():
    meta = {"route": "ANSWER", "sources": [{"n": 1, "url": "https://x.example", "cited": True}]}
    assert relay.from_log(SESSION, 1, "Xero syncs", meta) == [
        {"type": "sources", "sources": [{"n": 1, "url": "https://x.example"}]},
        {"type": "token", "content": "Xero syncs"},
        {"type": "complete", "session_id": SESSION, "turn": 1, "metadata": meta}]


async def test_the_turns_other_log_events_are_progress_read_by_their_turn_only():
    """Events the relay does not act on (a retrieval, an LLM call record) only restart the
    stall clock, read by their turn number alone: the turn's do, another turn's and an
    undecodable one do not."""
    later = turn(SITE, SESSION, 2, "and Sage?")
    retrieved = ev.follow(REQUEST, ev.RetrievalCompleted, "retrieval", documents=[])
    other_turn = ev.follow(later, ev.RetrievalCompleted, "retrieval", documents=[])
    garbage = Msg(subjects.conv(SITE, SESSION, "retrieval_completed"), b"{not json")
    turn_relay = TurnRelay(None, SITE, SESSION, 1, deadline_s=10.0, stall_s=0.5)

    async def steps():
        for _ in range(4):  # 1.2 s of the turn's own events: no stall
            turn_relay.queue.put_nowait(on_bus(retrieved))
            await asyncio.sleep(0.3)
        for _ in range(30):  # then only another turn's and garbage: the stall
            turn_relay.queue.put_nowait(on_bus(other_turn))
            turn_relay.queue.put_nowait(garbage)
            await asyncio.sleep(0.1)

    started = time.monotonic()
    step = asyncio.create_task(steps())
    batches = [batch async for batch in turn_relay.batches()]
    step.cancel()
    assert sum(batches, []) == [STALLED]
    assert 1.4 <= time.monotonic() - started < 2.5


class _Finished:
    """A relay whose turn completed: a token, then `complete` (what `TurnRelay.batches`
    hands out for a turn the log ended)."""
    site, session_id, turn, requested, bus = SITE, SESSION, 1, REQUEST, None

    async def batches(self):
        yield [{"type": "token", "content": "Hello"}]
        yield [{"type": "complete", "session_id": SESSION, "turn": 1, "metadata": {"route": "ANSWER"}}]

    def gave_up(self):
        return None

    async def close(self):
        pass


async def test_a_completed_turn_frees_its_session_before_its_complete_goes_out():
    """The session's guard is released (`done`) before the visitor reads `complete`: a next
    message sent the moment it arrives is never refused as overlapping the turn it follows
    (seen in CI: 429 for the message after a completed one)."""
    from services.gateway import frames, streams

    happened: list[str] = []

    async def done():
        happened.append("released")

    async for chunk in streams.relayed(_Finished(), frames.Numbering(1), "tok", done=done):
        happened.append("complete" if b'"complete"' in chunk else "frame")
    assert happened == ["frame", "frame", "released", "complete"]  # start, the token, then the end
