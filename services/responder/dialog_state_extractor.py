"""dialog_state_extractor: this turn's dialog flags → `DialogStateExtracted`.

A flag per marker the reply carries (reply_markers.py: a demo proposed, an e-mail asked
for...), whether the visitor's message gave an e-mail address, and whether the reply asked
the visitor something. The state keeps them as the latest turn's flags and the "ever" ones.
"""

from __future__ import annotations

from services.responder.reply_markers import MARKERS, ends_with_question
from shared import events as ev
from shared import history
from shared.node import Context, Inputs, Needs, Node, PermanentError
from shared.privacy import EMAIL_RE

NAME = "dialog_state_extractor"


def dialog_flags(user_message: str, reply: str) -> dict[str, bool]:
    flags = {flag: marker in reply for marker, flag in MARKERS.items()}
    flags["email_captured"] = bool(EMAIL_RE.search(user_message))
    flags["asked_visitor"] = ends_with_question(reply)
    return flags


async def extract_dialog_state(event: ev.ResponseCompleted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    record = inputs.state.turns.get(event.turn)
    if record is None or "turn_requested" not in record.seen:
        raise PermanentError(f"no TurnRequested for turn {event.turn}")
    flags = dialog_flags(history.message_of(inputs.state, event.turn), event.text)
    return [ctx.follow(ev.DialogStateExtracted, flags=flags)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("response_completed",), handle=extract_dialog_state, needs=Needs(state=True))
