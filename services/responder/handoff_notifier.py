"""handoff_notifier: tells the site's team about each handoff request (on `HandoffRequested`),
so a team can route it to the chat tool it already uses.

- Webhook: POST JSON (`handoff.requested`: why, the transcript, the visitor profile, the
  interest score, the lead's e-mail when one was captured) to the site's
  `handoff.webhook_url`, else its `lead.webhook_url`, else LEAD_WEBHOOK_URL; none: recorded
  as skipped, nothing sent. Signed with the site's lead webhook secret and retried as
  webhooks.py says; the outcome is stored as `WebhookRecorded(hook="handoff")` whatever it is.
- One request, one delivery: each `HandoffRequested` claims its own delivery
  (webhook_claims.py); a redelivery after the outcome was stored reports it again and sends
  nothing. The `webhook-id` (`handoff_id`) is the request's on every attempt.

It runs apart from the reply, so a slow receiver never delays the visitor's waiting message.
"""

from __future__ import annotations

import msgspec

from services.responder import webhooks
from services.responder.settings import LeadSettings
from services.responder.webhook_claims import Outcome, WebhookClaims, deliver_once, handoff_id
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node, conversation_only

NAME = "handoff_notifier"


def payload(event: ev.HandoffRequested, inputs: Inputs) -> dict:
    state = inputs.state
    leads = inputs.log.get("lead_captured", ())
    return {
        "event": "handoff.requested", "event_id": event.event_id, "site": event.site,
        "session_id": event.session_id, "turn": event.turn, "ts": event.ts,
        "reason": event.reason, "detail": event.detail,
        "transcript": webhooks.transcript(state, event.turn),
        "visitor_profile": msgspec.to_builtins(state.visitor_profile),
        "interest_score": state.interest.score,
        "lead_email": leads[0].email if leads else None,  # the conversation's lead is its first capture
    }


def make_node(claims: WebhookClaims, settings: LeadSettings = LeadSettings(),
              senders: webhooks.Senders | None = None) -> Node:
    http = senders or webhooks.Senders.of(settings)

    async def deliver(event: ev.HandoffRequested, inputs: Inputs) -> Outcome:
        config = inputs.config
        url = config.handoff.webhook_url or config.lead.webhook_url or settings.webhook_url
        return await webhooks.send(http, settings, "handoff", url, event.site, config.lead,
                                   handoff_id(event.site, event.session_id, event.event_id), payload(event, inputs))

    async def handle(event: ev.HandoffRequested, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        # The outcome: sent now, or stored by this very event before (redelivered: its ack was lost).
        claim = await deliver_once(claims, event.site, event.session_id, event.event_id,
                                   lambda: deliver(event, inputs))
        return [ctx.follow(ev.WebhookRecorded, hook="handoff", **msgspec.structs.asdict(claim.outcome))]

    return Node(name=NAME, consumes=("handoff_requested",), handle=handle,
                needs=Needs(state=True, config=True, log=("lead_captured",), when=conversation_only))
