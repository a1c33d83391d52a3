"""lead_notifier: tells the outside world about a captured lead (on `LeadCaptured`).

- Webhook: POST JSON to the site's `lead.webhook_url` (or LEAD_WEBHOOK_URL), signed with
  HMAC-SHA256 of the body under LEAD_WEBHOOK_SECRET in `X-Concierge-Signature:
  sha256=<hex>`, with `X-Concierge-Event-Id` for the receiver's dedupe. Retried with
  exponential backoff on connection errors, timeouts, 429 and 5xx (LEAD_WEBHOOK_ATTEMPTS,
  LEAD_WEBHOOK_BACKOFF_S); the outcome is stored as `WebhookRecorded` whatever it is.
- Analytics: a `lead_captured` event to a PostHog-compatible capture API (POSTHOG_HOST,
  POSTHOG_API_KEY) when configured; stored as `AnalyticsRecorded` either way.

It runs apart from the reply, so a slow CRM never delays the visitor.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random

import httpx
import msgspec

from shared import events as ev
from shared import loader
from shared.config import env_float, env_int, env_str
from shared.consumer import Context, Node
from shared.site_config import SiteConfigs

log = logging.getLogger(__name__)

NAME = "lead_notifier"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def post_webhook(client: httpx.AsyncClient, url: str, body: bytes, headers: dict, attempts: int,
                       backoff_s: float) -> tuple[bool, int | None, int, str | None]:
    status, error = None, None
    for attempt in range(1, attempts + 1):
        try:
            response = await client.post(url, content=body, headers=headers)
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


def make_node(configs: SiteConfigs, client: httpx.AsyncClient | None = None) -> Node:
    http = client or httpx.AsyncClient(timeout=env_float("LEAD_WEBHOOK_TIMEOUT_S", 5.0))

    async def handle(event: ev.LeadCaptured, ctx: Context) -> list[ev.Envelope]:
        config = await configs.get(event.site)
        state = await loader.load(ctx.bus, event.site, event.session_id)
        url = config.lead.webhook_url or env_str("LEAD_WEBHOOK_URL", "")
        outputs: list[ev.Envelope] = []
        if url:
            payload = {
                "event": "lead.captured", "event_id": event.event_id, "site": event.site,
                "session_id": event.session_id, "turn": event.turn, "ts": event.ts,
                "email": event.email, "capture_context": event.capture_context,
                "collected": dict(state.booking.collected),
                "visitor_profile": msgspec.to_builtins(state.visitor_profile),
            }
            body = json.dumps(payload, separators=(",", ":")).encode()
            headers = {"Content-Type": "application/json", "X-Concierge-Event-Id": event.event_id}
            secret = env_str("LEAD_WEBHOOK_SECRET", "")
            if secret:
                headers["X-Concierge-Signature"] = sign(secret, body)
            ok, status, attempts, error = await post_webhook(
                http, url, body, headers, max(1, env_int("LEAD_WEBHOOK_ATTEMPTS", 4)),
                env_float("LEAD_WEBHOOK_BACKOFF_S", 0.5))
            if not ok:
                log.error("lead webhook failed", extra={"target": url, "status": status, "error": error})
            outputs.append(ctx.follow(ev.WebhookRecorded, target=url, ok=ok, status=status, attempts=attempts,
                                      error=error))
        else:
            outputs.append(ctx.follow(ev.WebhookRecorded, target="", ok=False, skipped=True,
                                      error="no webhook configured"))
        properties = {"site": event.site, "capture_context": event.capture_context, "turn": event.turn}
        host, key = env_str("POSTHOG_HOST", ""), env_str("POSTHOG_API_KEY", "")
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

    return Node(name=NAME, consumes=("lead_captured",), handle=handle)
