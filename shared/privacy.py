"""What may be stored about a visitor, and how it is keyed.

A raw IP never enters the event log or the logs: events carry `ip_hash` (a keyed HMAC,
truncated). The raw IP lives only in Redis, under a short TTL, for the enrichment
providers that need it, and is erased with the visitor.
"""

from __future__ import annotations

import hashlib
import hmac

from shared.config import env_float, env_str

# A deployment sets its own secret, so hashes cannot be reversed by hashing all IPv4s.
_DEV_SECRET = "concierge-dev-only-ip-secret"
RAW_IP_TTL_S = env_float("RAW_IP_TTL_S", 900.0)


def ip_hash(ip: str, secret: str | None = None) -> str:
    key = (secret or env_str("IP_HASH_SECRET", _DEV_SECRET)).encode()
    return hmac.new(key, ip.strip().encode(), hashlib.sha256).hexdigest()[:16]


def raw_ip_key(site: str, session_id: str) -> str:
    return f"concierge:rawip:{site}:{session_id}"


def cache_key(site: str, ip_digest: str) -> str:
    return f"concierge:enrich:cache:{site}:{ip_digest}"


def returning_key(site: str, ip_digest: str) -> str:
    return f"concierge:enrich:visitor:{site}:{ip_digest}"
