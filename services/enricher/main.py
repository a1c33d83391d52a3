"""Enricher service: the `enrichment` node (which company? from cache, returning visitors,
browser reveal data, a session-identification provider and an IP source: the chain in
chain.py), then the `visitor_profiler` node (what are they trying to do?)."""

from __future__ import annotations

from pathlib import Path

import httpx

from shared import redis_client, service
from shared.config import ConfigError, env_float, env_int, env_str
from shared.llm import LLMClient
from shared.node import Node
from services.enricher import enrichment, visitor_profiler
from services.enricher.breaker import CircuitBreaker
from services.enricher.chain import Enricher
from services.enricher.sources import (
    CacheSource, Guarded, IpApiSource, IpDatasetSource, ReturningVisitorSource, RevealSource,
    SessionProviderSource,
)

DATASET = Path(__file__).parent / "data" / "ip_companies.csv"


def guarded(source, prefix: str) -> Guarded:
    return Guarded(
        source,
        timeout_s=env_float(f"{prefix}_TIMEOUT_S", 0.8),
        retries=env_int(f"{prefix}_RETRIES", 1),
        breaker=CircuitBreaker(threshold=env_int(f"{prefix}_BREAKER_THRESHOLD", 3),
                               reset_after_s=env_float(f"{prefix}_BREAKER_RESET_S", 30.0)),
    )


def build_enricher(redis, client: httpx.AsyncClient) -> Enricher:
    """Sources in priority order; remote providers only when configured, the offline IP
    dataset otherwise."""
    sources: list = [RevealSource()]
    if env_str("ENRICH_SESSION_PROVIDER_URL", ""):
        sources.append(guarded(SessionProviderSource(env_str("ENRICH_SESSION_PROVIDER_URL", ""),
                                                     env_str("ENRICH_SESSION_PROVIDER_KEY", ""), client),
                               "ENRICH_SESSION_PROVIDER"))
    if env_str("ENRICH_IP_API_URL", ""):
        sources.append(guarded(IpApiSource(env_str("ENRICH_IP_API_URL", ""), env_str("ENRICH_IP_API_KEY", ""), client),
                               "ENRICH_IP_API"))
    else:
        sources.append(IpDatasetSource(Path(env_str("ENRICH_IP_DATASET", str(DATASET)))))
    return Enricher(
        redis=redis,
        cache=CacheSource(redis, ttl_s=env_float("ENRICH_CACHE_TTL_S", 600.0)),
        returning=ReturningVisitorSource(redis, ttl_s=env_float("ENRICH_RETURNING_TTL_S", 30 * 24 * 3600.0)),
        sources=sources,
        deadline_s=env_float("ENRICH_DEADLINE_S", 1.5),
    )


async def nodes(bus):
    enricher = build_enricher(redis_client.connect(), httpx.AsyncClient())
    backend = env_str("PROFILER_BACKEND", "local")
    if backend not in ("local", "llm"):
        raise ConfigError(f"PROFILER_BACKEND={backend!r}: use local or llm")
    llm = LLMClient.from_env(("profiler",)) if backend == "llm" else None
    return enricher_nodes(enricher, llm)


def enricher_nodes(enricher: Enricher | None, profiler_llm: LLMClient | None) -> list[Node]:
    """The enricher's nodes (also what a replay runs, with no sources: enrichment is copied there)."""
    return [enrichment.make_node(enricher), visitor_profiler.make_node(profiler_llm)]


def main() -> None:
    service.main("enricher", nodes)


if __name__ == "__main__":
    main()
