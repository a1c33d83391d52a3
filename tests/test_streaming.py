"""A reply known whole (a template, an extractive answer) goes out a sentence at a time."""

from __future__ import annotations

from services.responder.streaming import stream_text
from shared.node import Context
from tests.helpers import RecordingBus, turn


async def test_a_known_reply_streams_a_sentence_at_a_time_and_adds_up_to_the_text():
    text = ("QuickBooks Online and Xero sync every 10 minutes [1]. Invoices, payments and customers move "
            "both ways [1][2]. Version 2.0 is live.\n📅 Would a short demo help?")
    bus, cause = RecordingBus(), turn("s", "x", 1, "Do you integrate with QuickBooks?")
    completed = await stream_text(Context(bus=bus, node="answer_writer", cause=cause, attempt=1), "answer_writer", text)
    pieces = [t.content for t in bus.tokens]
    assert pieces == ["QuickBooks Online and Xero sync every 10 minutes [1]. ",
                      "Invoices, payments and customers move both ways [1][2]. ", "Version 2.0 is live.\n",
                      "📅 Would a short demo help?"]
    assert "".join(pieces) == completed.text == text and completed.token_count == 4
    assert [t.index for t in bus.tokens] == [0, 1, 2, 3]
