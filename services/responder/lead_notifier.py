"""lead_notifier: tells the outside world about a captured lead (on `LeadCaptured`).

- Webhook: POST JSON (the lead, the booking answers, the visitor profile and the
  conversation's transcript) to the site's `lead.webhook_url` (or LEAD_WEBHOOK_URL), signed
  and retried as webhooks.py says; the outcome is stored as `WebhookRecorded` whatever it is.
- One lead, one delivery: the first `LeadCaptured` of a conversation claims its lead
  (webhook_claims.py); a copy with another event id records `WebhookRecorded(skipped,
  duplicate_of=<owner>)` and sends nothing, neither webhook nor analytics. An erased
  lead's copy (its e-mail redacted) sends nothing and records nothing.
- Analytics: a `lead_captured` event to a PostHog-compatible capture API (POSTHOG_HOST,
  POSTHOG_API_KEY) when configured; stored as `AnalyticsRecorded` either way.

It runs apart from the reply, so a slow CRM never delays the visitor.
"""

from __future__ import annotations

import logging

import httpx
import msgspec

from services.responder import webhooks
from services.responder.settings import LeadSettings
from services.responder.webhook_claims import Outcome, WebhookClaims, deliver_once, lead_id
from shared import events as ev
from shared.node import Context, Inputs, Needs, Node, conversation_only
from shared.privacy import REDACTED

log = logging.getLogger(__name__)

NAME = "lead_notifier"


def make_node(claims: WebhookClaims, settings: LeadSettings = LeadSettings(),
              senders: webhooks.Senders | None = None) -> Node:
    http = senders or webhooks.Senders.of(settings)
    analytics = httpx.AsyncClient(timeout=settings.timeout_s)  # the deployment's own PostHog: not a site's input

    async def deliver(event: ev.LeadCaptured, inputs: Inputs) -> Outcome:
        state, config = inputs.state, inputs.config
        payload = {
            "event": "lead.captured", "event_id": event.event_id, "site": event.site,
            "session_id": event.session_id, "turn": event.turn, "ts": event.ts,
            "email": event.email, "capture_context": event.capture_context,
            "collected": dict(state.booking.collected),
            "visitor_profile": msgspec.to_builtins(state.visitor_profile),
            "company_domain": _known(state.visitor_profile.company_domain),
            "person_id": state.person_id or None,
            "transcript": webhooks.transcript(state, event.turn),
        }
        return await webhooks.send(http, settings, "lead", config.lead.webhook_url or settings.webhook_url,
                                   event.site, config.lead, lead_id(event.site, event.session_id), payload)

    async def handle(event: ev.LeadCaptured, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        if event.email == REDACTED:
            # An erased lead's copy (`concierge erase-visitor` stores the log again): its
            # webhook went out when it was captured, or never will; nothing more is said
            # about the visitor to anyone, not even an analytics event.
            return []
        # The outcome: sent now, or stored by this very event before (redelivered: its ack was lost).
        claim = await deliver_once(claims, event.site, event.session_id, event.event_id,
                                   lambda: deliver(event, inputs))
        if claim.owner != event.event_id:
            log.info("duplicate lead not sent", extra={"event_id": event.event_id, "duplicate_of": claim.owner})
            return [ctx.follow(ev.WebhookRecorded, target="", ok=False, skipped=True, error="duplicate lead",
                               duplicate_of=claim.owner)]
        outcome = claim.outcome
        outputs: list[ev.Envelope] = [ctx.follow(ev.WebhookRecorded, **msgspec.structs.asdict(outcome))]
        state = inputs.state
        properties = {"site": event.site, "capture_context": event.capture_context, "turn": event.turn}
        if domain := _known(state.visitor_profile.company_domain):
            properties["company_domain"] = domain
        # The person the site knows, when its page said who (PostHog ties the lead to them);
        # the conversation otherwise.
        distinct_id = state.person_id or event.session_id
        host, key = settings.posthog_host, settings.posthog_api_key
        sent, ok, error = False, False, None
        if host and key:
            sent = True
            try:
                response = await analytics.post(host.rstrip("/") + "/capture/", json={
                    "api_key": key, "event": "lead_captured", "distinct_id": distinct_id,
                    "properties": properties, "timestamp": event.ts})
                ok = 200 <= response.status_code < 300
                error = None if ok else f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
        outputs.append(ctx.follow(ev.AnalyticsRecorded, event_name="lead_captured", properties=properties,
                                  sent=sent, ok=ok, error=error))
        return outputs

    return Node(name=NAME, consumes=("lead_captured",), handle=handle,
                needs=Needs(state=True, config=True, when=conversation_only))


def _known(value: str) -> str | None:
    return None if value in ("", ev.UNKNOWN) else value
