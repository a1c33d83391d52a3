"""Post-processing of a reply, each its own node on `ResponseCompleted`:

- dialog_state_extractor: flags of this turn (the reply's markers, a captured e-mail,
  whether the reply asked the visitor something) → `DialogStateExtracted`;
- form_field_extractor: values the visitor gave in this turn's message (e-mail, phone,
  name, company) → `FormFieldsExtracted`;
- suggestion_router: follow-up questions, or answer options when the reply ended with a
  question → `SuggestionsRouted` (or `SuggestionsGenerated(kind="none")` for an empty reply).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from shared import events as ev
from shared import subjects
from shared.node import Context, Node, PermanentError
from shared.privacy import EMAIL_RE

MARKERS: dict[str, str] = tomllib.loads((Path(__file__).parent / "data" / "dialog_markers.toml").read_text())["markers"]

PHONE_RE = re.compile(r"(?<!\w)\+?\d[\d ().-]{7,}\d")
NAME_RE = re.compile(r"\b(?i:my name is|i am|i'm|je m'appelle|me llamo|ich heiße|mi chiamo)\s+([A-Z][\w'-]+(?:\s[A-Z][\w'-]+)?)")
COMPANY_RE = re.compile(r"\b(?i:i work (?:at|for)|our company is|je travaille chez|trabajo en|ich arbeite bei)\s+([A-Z][\w&.'-]*(?:\s[A-Z][\w&.'-]*){0,3})")


def ends_with_question(text: str) -> bool:
    stripped = text.strip()
    for marker in MARKERS:
        stripped = stripped.replace(marker, "")
    return stripped.rstrip().endswith("?")


def dialog_flags(user_message: str, reply: str) -> dict[str, bool]:
    flags = {flag: marker in reply for marker, flag in MARKERS.items()}
    flags["email_captured"] = bool(EMAIL_RE.search(user_message))
    flags["asked_visitor"] = ends_with_question(reply)
    return flags


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


async def _user_message(ctx: Context, event: ev.Envelope) -> str:
    """This turn's message: the session's newest TurnRequested (no next turn can start
    before this one completes)."""
    requested = await ctx.bus.last(subjects.conv(event.site, event.session_id, "turn_requested"))
    if requested is None or requested.turn != event.turn:
        raise PermanentError(f"no TurnRequested for turn {event.turn}")
    return requested.message


async def extract_dialog_state(event: ev.ResponseCompleted, ctx: Context) -> list[ev.Envelope]:
    return [ctx.follow(ev.DialogStateExtracted, flags=dialog_flags(await _user_message(ctx, event), event.text))]


async def extract_form_fields(event: ev.ResponseCompleted, ctx: Context) -> list[ev.Envelope]:
    return [ctx.follow(ev.FormFieldsExtracted, values=form_values(await _user_message(ctx, event)))]


async def route_suggestions(event: ev.ResponseCompleted, ctx: Context) -> list[ev.Envelope]:
    if not event.text.strip():
        return [ctx.follow(ev.SuggestionsGenerated, kind="none")]
    kind = "answers" if ends_with_question(event.text) else "follow_up"
    return [ctx.follow(ev.SuggestionsRouted, kind=kind)]


dialog_state_extractor = Node("dialog_state_extractor", ("response_completed",), extract_dialog_state)
form_field_extractor = Node("form_field_extractor", ("response_completed",), extract_form_fields)
suggestion_router = Node("suggestion_router", ("response_completed",), route_suggestions)
