"""lead_notifier: tells the outside world about a captured lead (on `LeadCaptured`).

- Webhook: POST JSON to the site's `lead.webhook_url` (or LEAD_WEBHOOK_URL), signed the
  Standard Webhooks way (standardwebhooks.com): `webhook-id` (the lead's, the same on every
  attempt and every copy), `webhook-timestamp` (this attempt's), `webhook-signature`
  (`v1,` + base64 HMAC-SHA256 of `id.timestamp.body` under the site's secret, see
  shared/webhook_secret.py). A receiver verifies it, rejects stale timestamps (replays) and
  drops repeated ids. No secret, no POST: an unsigned lead is never sent. Retried with
  exponential backoff on connection errors, timeouts, 429 and 5xx (LEAD_WEBHOOK_ATTEMPTS,
  LEAD_WEBHOOK_BACKOFF_S); the outcome is stored as `WebhookRecorded` whatever it is.
- One lead, one delivery: the first `LeadCaptured` of a conversation claims its lead
  (lead_claims.py); a copy with another event id records `WebhookRecorded(skipped,
  duplicate_of=<owner>)` and sends nothing, neither webhook nor analytics.
- Analytics: a `lead_captured` event to a PostHog-compatible capture API (POSTHOG_HOST,
  POSTHOG_API_KEY) when configured; stored as `AnalyticsRecorded` either way.

It runs apart from the reply, so a slow CRM never delays the visitor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from datetime import datetime, timezone

import httpx
import msgspec
from standardwebhooks.webhooks import Webhook

from services.responder.lead_claims import LeadClaims, Outcome, lead_id
from services.responder.settings import LeadSettings
from shared import events as ev
from shared import webhook_secret
from shared.node import Context, Inputs, Needs, Node

log = logging.getLogger(__name__)

NAME = "lead_notifier"


def signed_headers(signer: Webhook, msg_id: str, body: bytes, now: float) -> dict[str, str]:
    timestamp = int(now)
    signature = signer.sign(msg_id, datetime.fromtimestamp(timestamp, timezone.utc), body.decode())
    return {"Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


async def post_webhook(client: httpx.AsyncClient, url: str, body: bytes, signer: Webhook, msg_id: str,
                       attempts: int, backoff_s: float) -> tuple[bool, int | None, int, str | None]:
    status, error = None, None
    for attempt in range(1, attempts + 1):
        try:
            # Signed per attempt: a retry carries a fresh timestamp, so it passes a receiver's
            # replay window however long the backoff was.
            response = await client.post(url, content=body, headers=signed_headers(signer, msg_id, body, time.time()))
            status = response.status_code
            if 200 <= status < 300:
                return True, status, attempt, None
            error = f"HTTP {status}"
            if status < 500 and status != 429:
                return False, status, attempt, error  # the receiver refused it: retrying cannot help
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        if attempt < attempts:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1) * (0.8 + 0.4 * random.random()))
    return False, status, attempts, error


def make_node(claims: LeadClaims, settings: LeadSettings = LeadSettings(),
              client: httpx.AsyncClient | None = None) -> Node:
    http = client or httpx.AsyncClient(timeout=settings.timeout_s)

    async def deliver(event: ev.LeadCaptured, inputs: Inputs) -> Outcome:
        state, config = inputs.state, inputs.config
        url = config.lead.webhook_url or settings.webhook_url
        if not url:
            return Outcome(target="", ok=False, skipped=True, error="no webhook configured")
        try:
            signer = Webhook(settings.secrets.for_site(event.site, config.lead))
        except webhook_secret.WebhookSecretError as exc:
            log.error("lead webhook not sent: no secret", extra={"target": url, "error": str(exc)})
            return Outcome(target=url, ok=False, error=str(exc))
        payload = {
            "event": "lead.captured", "event_id": event.event_id, "site": event.site,
            "session_id": event.session_id, "turn": event.turn, "ts": event.ts,
            "email": event.email, "capture_context": event.capture_context,
            "collected": dict(state.booking.collected),
            "visitor_profile": msgspec.to_builtins(state.visitor_profile),
        }
        body = json.dumps(payload, separators=(",", ":")).encode()
        ok, status, attempts, error = await post_webhook(
            http, url, body, signer, lead_id(event.site, event.session_id),
            max(1, settings.attempts), settings.backoff_s)
        if not ok:
            log.error("lead webhook failed", extra={"target": url, "status": status, "error": error})
        return Outcome(target=url, ok=ok, status=status, attempts=attempts, error=error)

    async def handle(event: ev.LeadCaptured, inputs: Inputs, ctx: Context) -> list[ev.Envelope]:
        claim = await claims.claim(event.site, event.session_id, event.event_id)
        if claim.owner != event.event_id:
            log.info("duplicate lead not sent", extra={"event_id": event.event_id, "duplicate_of": claim.owner})
            return [ctx.follow(ev.WebhookRecorded, target="", ok=False, skipped=True, error="duplicate lead",
                               duplicate_of=claim.owner)]
        outcome = claim.outcome  # set: delivered before, by this event, whose ack was lost
        if outcome is None:
            outcome = await deliver(event, inputs)
            await claims.settle(event.site, event.session_id, event.event_id, outcome)
        outputs: list[ev.Envelope] = [ctx.follow(ev.WebhookRecorded, **msgspec.structs.asdict(outcome))]
        properties = {"site": event.site, "capture_context": event.capture_context, "turn": event.turn}
        host, key = settings.posthog_host, settings.posthog_api_key
        sent, ok, error = False, False, None
        if host and key:
            sent = True
            try:
                response = await http.post(host.rstrip("/") + "/capture/", json={
                    "api_key": key, "event": "lead_captured", "distinct_id": event.session_id,
                    "properties": properties, "timestamp": event.ts})
                ok = 200 <= response.status_code < 300
                error = None if ok else f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
        outputs.append(ctx.follow(ev.AnalyticsRecorded, event_name="lead_captured", properties=properties,
                                  sent=sent, ok=ok, error=error))
        return outputs

    return Node(name=NAME, consumes=("lead_captured",), handle=handle, needs=Needs(state=True, config=True))
