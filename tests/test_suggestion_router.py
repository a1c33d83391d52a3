"""suggestion_router, given-when-then: when a reply is stored, which suggestions go under
it: answer options after a question, follow-up questions otherwise, none for an empty reply."""

from __future__ import annotations

import pytest

from services.responder import suggestion_router
from services.responder.reply_markers import ends_with_question
from shared import events as ev
from tests.helpers import decide, turn

NODE = suggestion_router.make_node()


@pytest.mark.parametrize(("reply", "kind"), [
    ("Do you use a CRM today?", "answers"),
    ("Would a short demo help? 📅", "answers"),  # a marker after the question: still a question
    ("Does it sync? It does, every 10 minutes.", "follow_up"),
    ("Tidewise schedules technicians [1].", "follow_up"),
])
async def test_a_reply_ending_with_a_question_gets_answer_options_any_other_follow_ups(reply, kind):
    request = turn("s", "r1", 1, "hello")
    completed = ev.follow(request, ev.ResponseCompleted, "answer_writer", node="answer_writer", text=reply,
                          token_count=1)
    (routed,) = (await decide(NODE, completed, request)).events
    assert isinstance(routed, ev.SuggestionsRouted) and routed.kind == kind
    assert routed.causation_id == completed.event_id


async def test_an_empty_reply_gets_no_suggestions_and_the_turn_still_closes():
    request = turn("s", "r2", 1, "hello")
    empty = ev.follow(request, ev.ResponseCompleted, "answer_writer", node="answer_writer", text="  \n",
                      token_count=0)
    (generated,) = (await decide(NODE, empty, request)).events
    assert isinstance(generated, ev.SuggestionsGenerated) and generated.kind == "none"
    assert generated.suggestions == []


def test_answers_mode_only_when_the_reply_ends_with_a_question():
    assert ends_with_question("Which CRM do you use?")
    assert ends_with_question("Which CRM do you use? 📅 ")
    assert not ends_with_question("Is it good? Yes, very.")
