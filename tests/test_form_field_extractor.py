"""form_field_extractor, given-when-then: given a turn's message, when its reply is stored,
the form values the visitor gave in that message (e-mail, phone, name, company)."""

from __future__ import annotations

import msgspec
import pytest

from services.responder import form_field_extractor
from services.responder.form_field_extractor import form_values
from shared import events as ev
from shared.node import PermanentError
from tests.helpers import decide, turn

NODE = form_field_extractor.make_node()


def replied(request: ev.TurnRequested, text: str = "Thanks!") -> ev.ResponseCompleted:
    return ev.follow(request, ev.ResponseCompleted, "answer_writer", node="answer_writer", text=text, token_count=1)


async def test_the_values_of_this_turns_message_are_extracted():
    first = turn("s", "f1", 1, "Hi, my name is Ada Lovelace")
    second = turn("s", "f1", 2, "I work at Analytical Engines Ltd. Mail ada@ae.io or call +44 20 7946 0958")
    reply = replied(second, "Thanks, Ada! Mail me at team@tidewise.example")  # the reply's own address is not hers
    (extracted,) = (await decide(NODE, reply, first, replied(first), second)).events
    assert isinstance(extracted, ev.FormFieldsExtracted) and extracted.causation_id == reply.event_id
    assert extracted.values == {"email": "ada@ae.io", "phone": "+442079460958", "company": "Analytical Engines Ltd"}


async def test_a_message_without_values_gives_none():
    request = turn("s", "f2", 1, "i am interested in the pricing for 20 seats")
    (extracted,) = (await decide(NODE, replied(request), request)).events
    assert extracted.values == {}


async def test_a_reply_to_a_turn_that_was_never_requested_fails_for_good():
    request = turn("s", "f3", 1, "I'm ada@ae.io")
    with pytest.raises(PermanentError, match="no TurnRequested for turn 2"):
        await decide(NODE, msgspec.structs.replace(replied(request), turn=2), request)


def test_form_values_from_the_visitors_message():
    got = form_values("Hi, my name is Ada Lovelace, I work at Analytical Engines Ltd. "
                      "Mail ada@ae.io or call +44 20 7946 0958")
    assert got == {"email": "ada@ae.io", "phone": "+442079460958", "name": "Ada Lovelace",
                   "company": "Analytical Engines Ltd"}
    assert form_values("je m'appelle Marie, je travaille chez Fromagerie Dupont") == {
        "name": "Marie", "company": "Fromagerie Dupont"}
    assert form_values("i am interested in the pricing for 20 seats") == {}
