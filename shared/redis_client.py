"""Redis: caches and lookups that are not events (enrichment cache, returning visitors,
the short-lived raw IP the enricher needs). `REDIS_URL` says where (read with the settings of
the services that use it)."""

from __future__ import annotations

import redis.asyncio as aioredis

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def connect(url: str) -> aioredis.Redis:
    return aioredis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0, health_check_interval=30)
