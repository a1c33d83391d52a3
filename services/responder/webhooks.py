"""Sending a webhook (lead_notifier's and handoff_notifier's): a JSON POST signed the Standard
Webhooks way (standardwebhooks.com), retried, its outcome returned for `WebhookRecorded`.

Headers: `webhook-id` (the lead's or the handoff request's, the same on every attempt and
every copy), `webhook-timestamp` (this attempt's), `webhook-signature` (`v1,` + base64
HMAC-SHA256 of `id.timestamp.body` under the site's secret, see shared/webhook_secret.py). A
receiver verifies it, rejects stale timestamps (replays) and drops repeated ids. No secret,
no POST: an unsigned webhook is never sent. Retried with exponential backoff on connection
errors, timeouts, 429 and 5xx (LEAD_WEBHOOK_ATTEMPTS, LEAD_WEBHOOK_BACKOFF_S).

A site's webhook URL is the site's input: it is sent through the outbound guard (shared/web.py),
as the crawler fetches, so a loopback, private or link-local address is refused (at connect
time, whatever the spelling) unless the deployment allows it. The deployment's own
LEAD_WEBHOOK_URL (its operator's, an internal relay maybe) is not a tenant's: it goes out
unguarded. No redirect is followed. What the outcome records is the status and a failure's
kind, never a response's body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from standardwebhooks.webhooks import Webhook

from services.responder.settings import LeadSettings
from services.responder.webhook_claims import Outcome
from shared import webhook_secret
from shared.site_config import Lead
from shared.state import ConversationState
from shared.web import CannotConnect, FetchError, Outbound, RefusedAddress, WebClient

log = logging.getLogger(__name__)

TRANSCRIPT_MESSAGES = 50  # the conversation's last messages a webhook carries


def transcript(state: ConversationState, turn: int) -> list[dict]:
    """The conversation's last messages up to `turn` (the event's: the same on a redelivery
    that finds later turns stored), oldest first."""
    messages = [m for m in state.messages if m.turn <= turn][-TRANSCRIPT_MESSAGES:]
    return [{"role": m.role, "content": m.content, "turn": m.turn} for m in messages]


def signed_headers(signer: Webhook, msg_id: str, body: bytes, now: float) -> dict[str, str]:
    timestamp = int(now)
    signature = signer.sign(msg_id, datetime.fromtimestamp(timestamp, timezone.utc), body.decode())
    return {"Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature}


RESPONSE_BYTES = 4096  # of a receiver's answer: only its status is used


USER_AGENT = "Concierge-Webhooks/1.0"


@dataclass(frozen=True)
class Senders:
    """The webhooks' HTTP clients: through the outbound guard for the sites' URLs, without it
    for the deployment's own (LEAD_WEBHOOK_URL)."""

    sites: WebClient
    deployment: WebClient

    @classmethod
    def of(cls, settings: LeadSettings) -> "Senders":
        return cls(WebClient(USER_AGENT, settings.outbound, settings.timeout_s, RESPONSE_BYTES),
                   WebClient(USER_AGENT, Outbound(allow_private=True), settings.timeout_s, RESPONSE_BYTES))

    def to(self, url: str, settings: LeadSettings) -> WebClient:
        return self.deployment if url == settings.webhook_url else self.sites


async def post_webhook(client: WebClient, url: str, body: bytes, signer: Webhook, msg_id: str,
                       attempts: int, backoff_s: float) -> Outcome:
    status, error, uncertain = None, None, 0
    for attempt in range(1, attempts + 1):
        try:
            # Signed per attempt: a retry carries a fresh timestamp, so it passes a receiver's
            # replay window however long the backoff was.
            response = await client.request("POST", url, headers=signed_headers(signer, msg_id, body, time.time()),
                                            body=body, follow=False)
            status = response.status
            if 200 <= status < 300:
                return Outcome(target=url, ok=True, status=status, attempts=attempt, uncertain=uncertain)
            error = f"HTTP {status}"
            if status < 500 and status != 429:  # the receiver refused it: retrying cannot help
                return Outcome(target=url, ok=False, status=status, attempts=attempt, error=error,
                               uncertain=uncertain)
        except RefusedAddress as exc:  # the same address again: refused again
            return Outcome(target=url, ok=False, attempts=attempt, error=f"refused: {exc}"[:300], uncertain=uncertain)
        except CannotConnect as exc:
            error = str(exc)[:300]
        except FetchError as exc:
            error = str(exc)[:300]
            uncertain += 1  # sent, perhaps received, never answered
        if attempt < attempts:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1) * (0.8 + 0.4 * random.random()))
    return Outcome(target=url, ok=False, status=status, attempts=attempts, error=error, uncertain=uncertain)


async def send(senders: Senders, settings: LeadSettings, hook: str, url: str, site: str, lead: Lead,
               msg_id: str, payload: dict) -> Outcome:
    """POST `payload` to `url`, signed with the site's secret (its `[lead]` table names it);
    `hook` (lead, handoff) names the webhook in the logs. No URL: skipped, nothing sent."""
    if not url:
        return Outcome(target="", ok=False, skipped=True, error="no webhook configured")
    try:
        signer = Webhook(settings.secrets.for_site(site, lead))
    except webhook_secret.WebhookSecretError as exc:
        log.error("webhook not sent: no secret", extra={"hook": hook, "target": url, "error": str(exc)})
        return Outcome(target=url, ok=False, error=str(exc))
    body = json.dumps(payload, separators=(",", ":")).encode()
    outcome = await post_webhook(senders.to(url, settings), url, body, signer, msg_id,
                                 max(1, settings.attempts), settings.backoff_s)
    if not outcome.ok:
        log.error("webhook failed",
                  extra={"hook": hook, "target": url, "status": outcome.status, "error": outcome.error})
    return outcome
