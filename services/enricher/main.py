"""Enricher service: the `enrichment` node (which company? from cache, returning visitors,
browser reveal data, a session-identification provider and an IP source: the chain in
chain.py), then the `visitor_profiler` node (what are they trying to do?)."""

from __future__ import annotations

from pathlib import Path

import httpx

from shared import redis_client, service
from shared.llm import LLMClient
from shared.node import Node
from services.enricher import enrichment, visitor_profiler
from services.enricher.breaker import CircuitBreaker
from services.enricher.chain import Enricher
from services.enricher.settings import EnricherSettings, RemoteSource
from services.enricher.sources import (
    CacheSource, Guarded, IpApiSource, IpDatasetSource, ReturningVisitorSource, RevealSource,
    SessionProviderSource,
)


def guarded(source, remote: RemoteSource) -> Guarded:
    return Guarded(
        source,
        timeout_s=remote.timeout_s,
        retries=remote.retries,
        breaker=CircuitBreaker(threshold=remote.breaker_threshold, reset_after_s=remote.breaker_reset_s),
    )


def build_enricher(redis, client: httpx.AsyncClient, settings: EnricherSettings) -> Enricher:
    """Sources in priority order; remote providers only when configured, the offline IP
    dataset otherwise."""
    sources: list = [RevealSource()]
    if (provider := settings.session_provider) is not None:
        sources.append(guarded(SessionProviderSource(provider.url, provider.key, client), provider))
    if (api := settings.ip_api) is not None:
        sources.append(guarded(IpApiSource(api.url, api.key, client), api))
    else:
        sources.append(IpDatasetSource(Path(settings.ip_dataset)))
    return Enricher(
        redis=redis,
        cache=CacheSource(redis, ttl_s=settings.cache_ttl_s),
        returning=ReturningVisitorSource(redis, ttl_s=settings.returning_ttl_s),
        sources=sources,
        deadline_s=settings.deadline_s,
    )


async def nodes(bus, settings: EnricherSettings):
    enricher = build_enricher(redis_client.connect(settings.redis_url), httpx.AsyncClient(), settings)
    llm = LLMClient(settings.llm) if settings.profiler_backend == "llm" else None
    return enricher_nodes(enricher, llm, settings)


def enricher_nodes(enricher: Enricher | None, profiler_llm: LLMClient | None, settings: EnricherSettings) -> list[Node]:
    """The enricher's nodes (also what a replay runs, with no sources: enrichment is copied there)."""
    return [enrichment.make_node(enricher),
            visitor_profiler.make_node(profiler_llm, route_wait_s=settings.profiler_route_wait_s)]


def main() -> None:
    service.main("enricher", EnricherSettings.from_env, nodes)


if __name__ == "__main__":
    main()
