"""booking_handler: the in-chat booking flow (BOOKING turns).

Each turn it takes what the visitor gave (an e-mail address, validated; the answer to the
field it asked last), asks for the next required field of the site's booking form, and,
when everything is there, gives the booking link with the collected values as query
parameters. The first captured e-mail also yields `LeadCaptured` (the lead_notifier node
sends the webhook and the analytics event). STOP leaves the flow politely.

The data (what was collected, what is next, the link) is decided here as a `Step`, from
the site's form (booking.py: parsing an answer, the next field, the link); the
fast `redirect` LLM role only words it, told exactly what to say. When that role has no
endpoint, a localized template (data/replies.toml) words it instead: the field's label,
a choice field's options, the booking link, `ResponseCompleted.backend = "template"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.responder import replies
from services.responder.booking import booking_url, next_field, parse_answer
from services.responder.settings import ROLES
from services.responder.streaming import TOKEN_BATCH_S, stream_llm, stream_text
from shared import events as ev
from shared import history, prompts, segments
from shared.llm import LLMClient, role_records
from shared.node import Context, Inputs, Needs, Node
from shared.privacy import EMAIL_RE
from shared.site_config import FormField, SiteConfig
from shared.state import ConversationState

NAME = "booking_handler"
PROMPT = Path(__file__).parent / "prompts" / "booking.md"


@dataclass(frozen=True)
class Step:
    """What this turn's reply must say: `ask` for `field`, say the answer to `field` was
    `invalid` or `not_a_choice` and ask again, `done` (with the booking link when the site
    has one), or `stop` (the visitor left the flow)."""

    kind: str
    field: FormField | None = None
    first: bool = False  # the flow starts with this turn: say a demo is welcome
    thanks: bool = False  # the visitor gave something this turn
    link: str = ""
    answer: str = ""  # the visitor's answer, when it was invalid


STOP = Step("stop")


def plan(state: ConversationState, turn: int, branch: str,
         config: SiteConfig) -> tuple[dict, Step, FormField | None, str]:
    """What this turn collects, what the reply must say, the next field, and the link."""
    message = history.message_of(state, turn)
    collected = dict(state.booking.collected)
    new: dict[str, str] = {}
    problem = None
    email = EMAIL_RE.search(message)
    if email:
        new["email"] = email.group(0).lower()
    pending = next((f for f in config.booking.fields if f.name == state.booking.pending_field), None)
    if pending is not None and branch == "STAY" and pending.name not in new:
        value, problem = parse_answer(pending, message)
        if value is not None:
            new[pending.name] = value
    collected.update(new)
    upcoming = next_field(config, collected)
    # The visitor's segment's booking page when it has one (shared/segments.py), else the site's.
    link = booking_url(config, collected, segments.for_visitor(config, state.visitor_profile).cta(config)[1])
    thanks = bool(new)
    if problem in ("not_an_email", "not_a_phone") and pending is not None:
        step = Step("invalid", pending, answer=message.strip()[:80])
    elif problem == "not_a_choice" and pending is not None:
        step = Step("not_a_choice", pending)
    elif upcoming is not None:
        first = state.booking.started_turn in (0, turn)  # the flow starts with this turn's route
        step = Step("ask", upcoming, first=first, thanks=thanks)
    else:
        step = Step("done", thanks=thanks, link=link)
    return new, step, upcoming, link


def instruction(step: Step) -> str:
    """What the `redirect` role is told to say."""
    label = step.field.label or step.field.name if step.field else ""
    thanks = "Thank the visitor for the details. " if step.thanks else ""
    if step.kind == "stop":
        return ("The visitor does not want to book a demo now. Acknowledge it politely in one sentence, "
                "say they can ask for a demo any time, and offer to keep answering their questions.")
    if step.kind == "invalid":
        return f"The visitor's {label} does not look valid ({step.answer!r}). Say so kindly and ask for it again."
    if step.kind == "not_a_choice":
        return f"Ask again for the {label}, offering these options: {', '.join(step.field.choices)}."
    if step.kind == "ask":
        options = f" Options: {', '.join(step.field.choices)}." if step.field.choices else ""
        start = "Say you'd be glad to set up a demo. " if step.first else ""
        return f"{start}{thanks}Ask for their {label}, and nothing else.{options}"
    if step.link:
        return (f"{thanks}Everything needed for the demo is collected. Tell them they can pick a time "
                f"with this link (write it out exactly): {step.link}")
    return f"{thanks}Everything needed for the demo is collected. Tell them the team will be in touch shortly."


def wording(step: Step, lang: str, site_name: str) -> str:
    """The reply without a model: the step in the visitor's language."""
    label = step.field.label or step.field.name if step.field else ""
    fields = {"label": label, "label_lc": replies.lower_first(label), "site_name": site_name, "link": step.link,
              "choices": " / ".join(step.field.choices) if step.field else ""}
    parts = []
    if step.first:
        parts.append("booking.start")
    if step.thanks:
        parts.append("booking.thanks")
    if step.kind == "ask":
        parts.append("booking.ask_choice" if step.field.kind == "choice" and step.field.choices else "booking.ask")
    elif step.kind == "not_a_choice":
        parts += ["booking.not_a_choice", "booking.ask_choice"]
    elif step.kind == "done":
        parts.append("booking.done_link" if step.link else "booking.done")
    else:
        parts.append(f"booking.{step.kind}")
    return " ".join(replies.text(key, lang, **fields) for key in parts)


def make_node(llm: LLMClient, token_batch_s: float = TOKEN_BATCH_S) -> Node:
    roles = role_records(llm, ROLES)  # recorded on the reply: what a replay re-runs it with

    async def handle(event: ev.RouteDecided, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        state, config = inputs.state, inputs.config
        outputs: list[ev.Envelope] = []
        if event.branch == "STOP":
            step = STOP
            outputs.append(ctx.follow(ev.BookingProgressed, pending_field=None, done=True))
        else:
            new, step, upcoming, _ = plan(state, event.turn, event.branch, config)
            outputs.append(ctx.follow(ev.BookingProgressed, pending_field=upcoming.name if upcoming else None,
                                      collected=new, done=upcoming is None))
            if "email" in new and not state.booking.lead_captured:
                outputs.append(ctx.follow(ev.LeadCaptured, email=new["email"], capture_context="in_chat_booking"))
        if not llm.configured("redirect"):
            lang = replies.visitor_language(state, event.turn)
            return outputs + [await stream_text(ctx, NAME, wording(step, lang, config.name or event.site),
                                                llm_roles=roles)]
        system = prompts.compose(PROMPT, event.site, config, step=instruction(step))
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": history.message_of(state, event.turn)}]
        completed = await stream_llm(ctx, llm, "redirect", NAME, messages, temperature=0.3, max_tokens=200,
                                     batch_s=token_batch_s, llm_roles=roles)
        return outputs + [completed]

    return Node(name=NAME, consumes=("route_decided",), handle=handle,
                needs=Needs(state=True, config=True, when=lambda event: event.route == "BOOKING"))
