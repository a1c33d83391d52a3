"""A reply known whole (a template, an extractive answer) goes out a sentence at a time; a
model's deltas go out batched, the first at once."""

from __future__ import annotations

import asyncio

import pytest

from services.responder.streaming import stream_llm, stream_text
from shared.node import Context
from tests.helpers import RecordingBus, turn


async def test_a_known_reply_streams_a_sentence_at_a_time_and_adds_up_to_the_text():
    text = ("QuickBooks Online and Xero sync every 10 minutes [1]. Invoices, payments and customers move "
            "both ways [1][2]. Version 2.0 is live.\n📅 Would a short demo help?")
    bus, cause = RecordingBus(), turn("s", "x", 1, "Do you integrate with QuickBooks?")
    completed = await stream_text(Context(out=bus, node="answer_writer", cause=cause, attempt=1), "answer_writer", text)
    pieces = [t.content for t in bus.tokens]
    assert pieces == ["QuickBooks Online and Xero sync every 10 minutes [1]. ",
                      "Invoices, payments and customers move both ways [1][2]. ", "Version 2.0 is live.\n",
                      "📅 Would a short demo help?"]
    assert "".join(pieces) == completed.text == text and completed.token_count == 4
    assert [t.index for t in bus.tokens] == [0, 1, 2, 3]


class ScriptedStream:
    """An LLMClient's `stream` as the model would feed it: (delay before, delta) pairs; a
    `check` callable runs before a delta, to see what went out meanwhile."""

    def __init__(self, steps, fail_after: int | None = None):
        self.steps, self.fail_after = steps, fail_after

    async def stream(self, role, messages, record, **params):
        for i, (delay, delta) in enumerate(self.steps):
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("model went away")
            await asyncio.sleep(delay)
            if callable(delta):
                delta = delta()
            yield delta


async def test_a_models_deltas_go_out_batched_the_first_at_once_and_add_up_to_the_text():
    bus, cause = RecordingBus(), turn("s", "x", 1, "Do you integrate with QuickBooks?")
    ctx = Context(out=bus, node="answer_writer", cause=cause, attempt=1)
    words = ["Quick", "Books", " Online", " and", " Xero", " sync", " every", " 10", " minutes", "."]
    seen_first = []

    def first_out():  # what had gone out when the second delta came: the first, alone
        seen_first.extend(t.content for t in bus.tokens)
        return words[1]

    steps = [(0, words[0]), (0.001, first_out)] + [(0.001, w) for w in words[2:]]
    completed = await stream_llm(ctx, ScriptedStream(steps), "answer", "answer_writer", [], batch_s=10.0)
    assert seen_first == ["Quick"]
    pieces = [t.content for t in bus.tokens]
    assert pieces == ["Quick", "Books Online and Xero sync every 10 minutes."]  # the rest at the end
    assert completed.text == "".join(words) and completed.token_count == len(pieces) == 2
    assert [t.index for t in bus.tokens] == [0, 1]


async def test_a_delta_left_waiting_by_a_pausing_model_goes_out_without_the_next():
    bus, cause = RecordingBus(), turn("s", "x", 1, "Hello?")
    ctx = Context(out=bus, node="answer_writer", cause=cause, attempt=1)
    during_pause = []

    def after_pause():
        during_pause.extend(t.content for t in bus.tokens)
        return " there"

    steps = [(0, "Hello"), (0.001, ","), (0.001, " you"), (0.5, after_pause)]
    completed = await stream_llm(ctx, ScriptedStream(steps), "answer", "answer_writer", [], batch_s=0.02)
    assert during_pause == ["Hello", ", you"]  # the timer sent them while the model paused
    assert [t.content for t in bus.tokens] == ["Hello", ", you", " there"]
    assert completed.token_count == 3 and completed.text == "Hello, you there"


async def test_no_batching_sends_one_token_event_per_delta():
    bus, cause = RecordingBus(), turn("s", "x", 1, "Hello?")
    ctx = Context(out=bus, node="answer_writer", cause=cause, attempt=1)
    completed = await stream_llm(ctx, ScriptedStream([(0, "a"), (0, "b"), (0, "c")]), "answer", "answer_writer", [],
                                 batch_s=0)
    assert [t.content for t in bus.tokens] == ["a", "b", "c"] and completed.token_count == 3


async def test_a_stream_that_fails_sends_what_the_model_said_and_leaves_no_timer_behind():
    bus, cause = RecordingBus(), turn("s", "x", 1, "Hello?")
    ctx = Context(out=bus, node="answer_writer", cause=cause, attempt=1)
    with pytest.raises(RuntimeError):
        await stream_llm(ctx, ScriptedStream([(0, "a"), (0, "b"), (0, " c"), (0, "d")], fail_after=3), "answer",
                         "answer_writer", [], batch_s=0.05)
    assert [t.content for t in bus.tokens] == ["a", "b c"]  # what waited for the timer, sent with the failure
    await asyncio.sleep(0.1)
    assert [t.index for t in bus.tokens] == [0, 1]  # and nothing after it


async def test_a_chunk_the_timer_is_sending_when_the_model_fails_goes_out_before_the_failure():
    """The flaky test_resilience (issue 54): the timer had taken the waiting text and was
    publishing it when the model broke; the failure went out before that chunk (and the
    gateway's stream ended without its text). The timer's publish is held here until well
    after the failure: stream_llm raises only once it is out."""

    class SlowSecondChunk(RecordingBus):
        async def publish_token(self, chunk):
            if getattr(chunk, "index", None) == 1:
                await asyncio.sleep(0.2)  # the timer's publish, still on its way
            await super().publish_token(chunk)

    class BreaksAfterAPause:
        async def stream(self, role, messages, record, **params):
            yield "a"
            yield "b"  # left for the timer (batch_s)
            await asyncio.sleep(0.05)  # the timer fires and starts publishing "b"
            raise RuntimeError("model went away")

    bus, cause = SlowSecondChunk(), turn("s", "x", 1, "Hello?")
    ctx = Context(out=bus, node="answer_writer", cause=cause, attempt=1)
    with pytest.raises(RuntimeError):
        await stream_llm(ctx, BreaksAfterAPause(), "answer", "answer_writer", [], batch_s=0.01)
    assert [(t.index, t.content) for t in bus.tokens] == [(0, "a"), (1, "b")]
