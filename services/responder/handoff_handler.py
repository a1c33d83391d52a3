"""handoff_handler: replies to HANDOFF turns, with no model.

A turn that asks for a person (the router's VISITOR_ASKED, LEAD_SCORE for a qualified
lead, NOT_FOUND after answers that found nothing) stores `HandoffRequested` (why), then:

- within the site's hours (`[handoff] hours`, shared/business_hours.py, at the time the
  visitor wrote) streams a localized waiting message (data/replies.toml `handoff.waiting`):
  the conversation now waits for the site's team (shared/state.py `HandoffState`), whose
  operators claim it and reply through the operator API; handoff_timer offers the e-mail
  follow-up if nobody joins in time;
- outside them ends it at once (`HandoffEnded`, by "system", `out_of_hours`) and asks for an
  e-mail address the team can write to (`handoff.out_of_hours`), or says they will write to
  the one the visitor gave: nobody is left waiting for a team that is not there.

EMAIL_LEFT (the visitor gave that address, router rule F): `LeadCaptured` (capture context
"handoff"; the lead webhook carries the transcript) and a thank-you naming the address.
A turn of a conversation already waiting for or held by a person (HELD) gets no answer at
all: an empty reply, so the turn closes (`complete`, route HANDOFF) and the visitor's message
waits for the operator in the log.
"""

from __future__ import annotations

from services.responder import replies
from services.responder.streaming import stream_text
from shared import business_hours
from shared import events as ev
from shared import history, metrics
from shared.node import Context, Inputs, Needs, Node
from shared.privacy import EMAIL_RE

NAME = "handoff_handler"
REASONS = {"VISITOR_ASKED": "visitor_asked", "LEAD_SCORE": "lead_score", "NOT_FOUND": "not_found"}


async def hand_off(event: ev.RouteDecided, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
    state, config = inputs.state, inputs.config
    if state.turns[event.turn].status != "requested":  # a copy of a turn that ended: its outputs are stored
        return []
    lang = replies.visitor_language(state, event.turn)
    site_name = config.name or event.site
    email = EMAIL_RE.search(history.message_of(state, event.turn)) if event.branch == "EMAIL_LEFT" else None
    if email is not None:  # rule F found one
        address = email.group(0).lower()
        return [ctx.follow(ev.LeadCaptured, email=address, capture_context="handoff"),
                await stream_text(ctx, NAME, replies.text("handoff.email_left", lang, site_name=site_name,
                                                          email=address))]
    if event.branch not in REASONS or state.handoff.status == "held" and state.handoff.requested_turn != event.turn:
        # HELD: the operator answers, not the AI (one may have joined since the router decided)
        return [ctx.follow(ev.ResponseCompleted, node=NAME, text="", token_count=0, attempt=ctx.attempt,
                           backend="template")]
    reason = REASONS[event.branch]
    metrics.handoffs.labels(reason).inc()
    requested = ctx.follow(ev.HandoffRequested, reason=reason, detail=event.reason)
    hours = config.handoff
    asked_at = state.turns[event.turn].requested_ts or event.ts
    if business_hours.schedule(hours.hours, hours.timezone).open_at(asked_at):
        return [requested, await stream_text(ctx, NAME, replies.text("handoff.waiting", lang, site_name=site_name))]
    metrics.handoffs_unanswered.labels("out_of_hours").inc()
    offer = replies.follow_up_offer("out_of_hours", state, lang, site_name=site_name,
                                    hours=business_hours.describe(hours.hours, hours.timezone))
    return [requested, ctx.follow(ev.HandoffEnded, by="system", outcome="out_of_hours"),
            await stream_text(ctx, NAME, offer)]


def make_node() -> Node:
    return Node(name=NAME, consumes=("route_decided",), handle=hand_off,
                needs=Needs(state=True, config=True, when=lambda event: event.route == "HANDOFF"))
