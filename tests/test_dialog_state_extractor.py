"""dialog_state_extractor, given-when-then: given a turn's message, when its reply is
stored, the flags the turn records (the reply's markers, an e-mail given, a question asked)."""

from __future__ import annotations

import msgspec
import pytest

from services.responder import dialog_state_extractor
from services.responder.dialog_state_extractor import dialog_flags
from shared import events as ev
from shared.node import PermanentError
from tests.helpers import decide, turn

NODE = dialog_state_extractor.make_node()


def replied(request: ev.TurnRequested, text: str) -> ev.ResponseCompleted:
    return ev.follow(request, ev.ResponseCompleted, "answer_writer", node="answer_writer", text=text, token_count=1)


async def test_the_turns_flags_come_from_its_reply_and_its_message():
    request = turn("s", "d1", 1, "you can reach me at bob@corp.example")
    reply = replied(request, "Great. Would a short demo help? 📅")
    (extracted,) = (await decide(NODE, reply, request)).events
    assert isinstance(extracted, ev.DialogStateExtracted) and extracted.causation_id == reply.event_id
    assert extracted.flags == {"demo_proposed": True, "email_requested": False, "qualifying_question_asked": False,
                               "resource_shared": False, "email_captured": True, "asked_visitor": True}


async def test_an_email_given_in_an_earlier_turn_is_not_this_turns():
    first = turn("s", "d2", 1, "I'm bob@corp.example")
    second = turn("s", "d2", 2, "what does it cost?")
    (extracted,) = (await decide(NODE, replied(second, "It starts at $29. ✉️"), first, replied(first, "Hi Bob."),
                                 second)).events
    assert extracted.flags["email_requested"] and not extracted.flags["email_captured"]
    assert not extracted.flags["asked_visitor"]


async def test_a_reply_to_a_turn_that_was_never_requested_fails_for_good():
    request = turn("s", "d3", 1, "hello")
    orphan = msgspec.structs.replace(replied(request, "Hi!"), turn=2)
    with pytest.raises(PermanentError, match="no TurnRequested for turn 2"):
        await decide(NODE, orphan, request)


def test_dialog_flags_read_markers_email_and_questions():
    flags = dialog_flags("sure, it's bob@corp.example", "Thanks! Shall I book a demo for you? 📅")
    assert flags["demo_proposed"] and flags["email_captured"] and flags["asked_visitor"]
    assert not flags["email_requested"]
    flags = dialog_flags("what is it?", "It is a chat assistant. ✉️")
    assert flags["email_requested"] and not flags["asked_visitor"] and not flags["email_captured"]
