"""Requests per minute per visitor IP and per site, counted in Redis (fixed windows), so
every gateway replica shares the same counts. Redis trouble lets requests through.

The IP's count is across sites, and the gateway checks it before it even looks the site
up, so made-up site names cost a caller their own budget and create no keys per name."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

WINDOW_S = 60


class RateLimiter:
    def __init__(self, redis, per_ip: int, per_site: int, name: str = "rl"):
        """`name`: the counts' own keys (`concierge:<name>:…`), so limiters of different
        requests (a chat turn, a vote) count apart."""
        self.redis = redis
        self.per_ip = per_ip
        self.per_site = per_site
        self.name = name

    async def retry_after(self, site: str | None, ip_digest: str | None, now: float | None = None) -> int | None:
        """Seconds until the caller may try again, or None when the request is allowed.
        Counts the site's window when `site` is given, the IP's when `ip_digest` is."""
        now = time.time() if now is None else now
        window = int(now // WINDOW_S)
        checks = []
        if site:
            checks.append((f"concierge:{self.name}:site:{site}:{window}", self.per_site))
        if ip_digest:
            checks.append((f"concierge:{self.name}:ip:{ip_digest}:{window}", self.per_ip))
        checks = [(key, limit) for key, limit in checks if limit > 0]  # 0 switches a limit off
        if not checks:
            return None
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, _ in checks:
                    pipe.incr(key)
                    pipe.expire(key, WINDOW_S * 2)
                counts = (await pipe.execute())[::2]
        except Exception as exc:
            log.warning("rate limiter unavailable; request allowed", extra={"error": repr(exc)})
            return None
        if any(count > limit for count, (_, limit) in zip(counts, checks, strict=True)):
            return max(1, int((window + 1) * WINDOW_S - now) + 1)
        return None
