"""form_field_extractor: the values the visitor gave in this turn's message (e-mail, phone,
name, company) → `FormFieldsExtracted`. The state merges them into the conversation's
form values, which fill the widget's booking link (finalize)."""

from __future__ import annotations

import re

from shared import events as ev
from shared import history
from shared.node import Context, Inputs, Needs, Node, PermanentError
from shared.privacy import EMAIL_RE

NAME = "form_field_extractor"
PHONE_RE = re.compile(r"(?<!\w)\+?\d[\d ().-]{7,}\d")
NAME_RE = re.compile(r"\b(?i:my name is|i am|i'm|je m'appelle|me llamo|ich heiße|mi chiamo)\s+([A-Z][\w'-]+(?:\s[A-Z][\w'-]+)?)")
COMPANY_RE = re.compile(r"\b(?i:i work (?:at|for)|our company is|je travaille chez|trabajo en|ich arbeite bei)\s+([A-Z][\w&.'-]*(?:\s[A-Z][\w&.'-]*){0,3})")


def form_values(user_message: str) -> dict[str, str]:
    values = {}
    if m := EMAIL_RE.search(user_message):
        values["email"] = m.group(0)
    if m := PHONE_RE.search(EMAIL_RE.sub(" ", user_message)):
        values["phone"] = re.sub(r"[^\d+]", "", m.group(0))
    if m := NAME_RE.search(user_message):
        values["name"] = m.group(1)
    if m := COMPANY_RE.search(user_message):
        values["company"] = re.split(r"[.,;!?]\s", m.group(1))[0].rstrip(".")  # one sentence at most
    return values


async def extract_form_fields(event: ev.ResponseCompleted, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    record = inputs.state.turns.get(event.turn)
    if record is None or "turn_requested" not in record.seen:
        raise PermanentError(f"no TurnRequested for turn {event.turn}")
    return [ctx.follow(ev.FormFieldsExtracted, values=form_values(history.message_of(inputs.state, event.turn)))]


def make_node() -> Node:
    return Node(name=NAME, consumes=("response_completed",), handle=extract_form_fields, needs=Needs(state=True))
