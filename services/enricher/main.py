"""Enricher service: the `enrichment` node (which company? from cache, returning visitors,
browser reveal data, then the site's providers: a session-identification API, a person
API, an IP API, and the offline IP data: the chain in chain.py), then the `visitor_profiler`
node (what are they trying to do?).

And the lead briefs (briefs/): `brief_requester` (a captured lead → a work item on the BRIEFS
work queue), `brief_gatherer` (the lead's data, gathered once), `lead_briefer` (the brief,
its checks and a call script, at most BRIEFS_CONCURRENCY at a time deployment-wide) and
`lead_triager` (a site's open leads ranked).

And the account reports (reports/): `report_gatherer` (an operator's work item for one
account → the account, its usage and its most relevant historical deals, gathered once) and
`account_reporter` (the nine-section report, its checks and a sales script, at most
REPORTS_CONCURRENCY at a time deployment-wide), `report_editor` (a report's edits, by hand or
asked for in words, one at a time deployment-wide, each a new version) and
`opportunity_finder` (a site's accounts ranked by opportunity, the best pre-selected).

And `insight_projector`: each conversation's insight record (shared/insight.py) kept current
in the `insight` bucket as its turns end and its visitor votes."""

from __future__ import annotations

from pathlib import Path

import httpx

from shared import insight, redis_client, service
from shared.llm import LLMClient
from shared.node import Node
from services.enricher import (account_reporter, brief_gatherer, brief_requester, enrichment, insight_projector,
                               lead_briefer, lead_triager, opportunity_finder, report_editor, report_gatherer,
                               visitor_profiler)
from services.enricher.breaker import CircuitBreaker
from services.enricher.chain import Enricher, Provider
from services.enricher.ip_owners import IpOwnerSource
from services.enricher.settings import EnricherSettings, RemoteSource
from services.enricher.sources import (
    CacheSource, Guarded, IpApiSource, IpDatasetSource, IpinfoSource, PdlSource, PersonApiSource,
    ReturningVisitorSource, RevealSource, SessionProviderSource, SnitcherSource,
)

# Each remote source's adapter by ENRICH_<SOURCE>_FORMAT (settings.*_FORMATS): Concierge's
# profile JSON, or a vendor's API and answer.
ADAPTERS = {
    "session_provider": {"concierge": SessionProviderSource, "snitcher": SnitcherSource},
    "person_api": {"concierge": PersonApiSource, "pdl": PdlSource},
    "ip_api": {"concierge": IpApiSource, "ipinfo": IpinfoSource},
}
NEEDS_ACCOUNT = {SnitcherSource}  # the vendor's URL names the site's account (its tracking script)


def guarded(source, remote: RemoteSource) -> Guarded:
    return Guarded(
        source,
        timeout_s=remote.timeout_s,
        retries=remote.retries,
        breaker=CircuitBreaker(threshold=remote.breaker_threshold, reset_after_s=remote.breaker_reset_s),
    )


def provider(name: str, remote: RemoteSource, client: httpx.AsyncClient) -> Provider:
    adapter = ADAPTERS[name][remote.format]
    return Provider(name=name, make=lambda key, account: adapter(remote.url, key, client, account),
                    guard=lambda source: guarded(source, remote), key=remote.key, account=remote.account,
                    needs_account=adapter in NEEDS_ACCOUNT, keyed=remote.format != "concierge")


def build_enricher(redis, client: httpx.AsyncClient, settings: EnricherSettings) -> Enricher:
    """The browser's reveal, then the configured providers (each site's chain in its order,
    with its keys: chain.py), and whenever no IP API is asked the offline IP sources: the CSV
    dataset when one is configured (the demo's), then the owner of the address's network
    unless ENRICH_IP_OWNERS=off."""
    remotes = {"session_provider": settings.session_provider, "person_api": settings.person_api,
               "ip_api": settings.ip_api}
    offline: list = [IpDatasetSource(Path(settings.ip_dataset))] if settings.ip_dataset else []
    if settings.ip_owners:
        offline.append(IpOwnerSource())
    return Enricher(
        redis=redis,
        cache=CacheSource(redis, ttl_s=settings.cache_ttl_s),
        returning=ReturningVisitorSource(redis, ttl_s=settings.returning_ttl_s),
        sources=[RevealSource()],
        providers={name: provider(name, remote, client) for name, remote in remotes.items() if remote is not None},
        ip_fallback=offline,
        site_keys=settings.site_keys,
        deadline_s=settings.deadline_s,
    )


async def nodes(bus, settings: EnricherSettings):
    enricher = build_enricher(redis_client.connect(settings.redis_url), httpx.AsyncClient(), settings)
    llm = LLMClient(settings.llm).prepare()
    profiler_llm = llm if settings.profiler_backend == "llm" else None
    return (enricher_nodes(enricher, profiler_llm, settings)
            + brief_nodes(llm if settings.briefs_with_llm() else None, settings)
            + [insight_projector.make_node(insight.Projections(bus))])


def enricher_nodes(enricher: Enricher | None, profiler_llm: LLMClient | None, settings: EnricherSettings) -> list[Node]:
    """The enricher's nodes (also what a replay runs, with no sources: enrichment is copied there)."""
    return [enrichment.make_node(enricher),
            visitor_profiler.make_node(profiler_llm, route_wait_s=settings.profiler_route_wait_s)]


def brief_nodes(llm: LLMClient | None, settings: EnricherSettings) -> list[Node]:
    """The lead-brief and account-report nodes (not in a replay: a brief or a report is an
    operator's artefact, not part of a turn)."""
    return [brief_requester.make_node(), brief_gatherer.make_node(),
            lead_briefer.make_node(llm, concurrency=settings.briefs_concurrency), lead_triager.make_node(llm),
            report_gatherer.make_node(), account_reporter.make_node(llm, concurrency=settings.reports_concurrency),
            report_editor.make_node(llm), opportunity_finder.make_node(llm)]


def main() -> None:
    service.main("enricher", EnricherSettings.from_env, nodes)


if __name__ == "__main__":
    main()
