"""What may be stored about a visitor, and how it is keyed.

A raw IP never enters the event log or the logs: events carry `ip_hash` (a keyed HMAC,
truncated). The raw IP lives only in Redis, under a short TTL, for the enrichment
providers that need it, and is erased with the visitor.
"""

from __future__ import annotations

import hashlib
import hmac
import re

import msgspec

from shared import events as ev
from shared.config import Settings, env_float, env_str

# A deployment sets its own secret, so hashes cannot be reversed by hashing all IPv4s.
DEV_SECRET = "concierge-dev-only-ip-secret"


class PrivacySettings(Settings):
    """The IP hash's key (IP_HASH_SECRET) and how long a raw IP stays in Redis (RAW_IP_TTL_S)."""

    SECRETS = ("ip_hash_secret",)
    ip_hash_secret: str = DEV_SECRET
    raw_ip_ttl_s: float = 900.0

    @classmethod
    def from_env(cls) -> "PrivacySettings":
        d = cls()
        return cls(ip_hash_secret=env_str("IP_HASH_SECRET", d.ip_hash_secret),
                   raw_ip_ttl_s=env_float("RAW_IP_TTL_S", d.raw_ip_ttl_s))

    def ip_hash(self, ip: str) -> str:
        return ip_hash(ip, self.ip_hash_secret)


def ip_hash(ip: str, secret: str) -> str:
    return hmac.new(secret.encode(), ip.strip().encode(), hashlib.sha256).hexdigest()[:16]


def raw_ip_key(site: str, session_id: str) -> str:
    return f"concierge:rawip:{site}:{session_id}"


def cache_key(site: str, ip_digest: str) -> str:
    return f"concierge:enrich:cache:{site}:{ip_digest}"


def returning_key(site: str, ip_digest: str) -> str:
    return f"concierge:enrich:visitor:{site}:{ip_digest}"


def seen_key(site: str, session_id: str) -> str:
    return f"concierge:enrich:seen:{site}:{session_id}"


REDACTED = "[redacted]"
# An e-mail address in free text, wherever one is looked for (redaction, the router's
# booking rule, the booking flow, the form-field extractor): the domain is dot-separated
# labels, none empty, ending in a TLD of two letters or more.
EMAIL_RE = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


def _scrub(text: str) -> str:
    return EMAIL_RE.sub(REDACTED, text)


def redact(event: ev.Envelope) -> tuple[ev.Envelope, list[str]]:
    """The event with its personal data removed, and the names of the fields it touched.

    Personal data: the visitor object the widget sent, IP hashes, e-mail addresses in
    profiles, and e-mail addresses written in free text (messages, prompts, answers)."""
    changes: dict = {}
    match event:
        case ev.TurnRequested():
            if event.visitor:
                changes["visitor"] = None
            if event.ip_hash:
                changes["ip_hash"] = REDACTED
            if _scrub(event.message) != event.message:
                changes["message"] = _scrub(event.message)
        case ev.EnrichmentCompleted() | ev.ProfileInferred():
            profile = event.profile
            fixed = msgspec.structs.replace(
                profile,
                ip=REDACTED if profile.ip not in ("", ev.UNKNOWN) else profile.ip,
                email=REDACTED if profile.email not in ("", ev.UNKNOWN) else profile.email,
            )
            if fixed != profile:
                changes["profile"] = fixed
        case ev.LLMCallRecorded():
            call = event.call
            messages = [{**m, "content": _scrub(m["content"])} if isinstance(m.get("content"), str) else m
                        for m in call.messages]
            fixed = msgspec.structs.replace(call, messages=messages, response_text=_scrub(call.response_text))
            if fixed != call:
                changes["call"] = fixed
        case ev.ResponseCompleted():
            if _scrub(event.text) != event.text:
                changes["text"] = _scrub(event.text)
        case ev.FormFieldsExtracted():
            if event.values:
                changes["values"] = {k: REDACTED for k in event.values}
        case ev.BookingProgressed():
            if event.collected:
                changes["collected"] = {k: REDACTED for k in event.collected}
        case ev.LeadCaptured():
            if event.email != REDACTED:
                changes["email"] = REDACTED
        case ev.TurnCompleted():
            profile = event.metadata.get("visitor_profile")
            if isinstance(profile, dict) and any(profile.get(k) not in (None, "", ev.UNKNOWN) for k in ("ip", "email")):
                cleaned = {**profile, **{k: REDACTED for k in ("ip", "email")
                                         if profile.get(k) not in (None, "", ev.UNKNOWN)}}
                changes["metadata"] = {**event.metadata, "visitor_profile": cleaned}
    if not changes:
        return event, []
    return msgspec.structs.replace(event, **changes), sorted(changes)
