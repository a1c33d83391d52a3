"""Retriever service: the `retrieval` node (retrieval.py; the search it runs, search.py)
over the sites' knowledge bases (LightRAG on Qdrant, one workspace per site), kept on the
snapshots ingestion publishes when KB_SNAPSHOTS=bus (snapshots.py); and the knowledge
sources' sync runs that change those knowledge bases (sources/: `sync_planner`,
`page_fetcher` on the work queue, `sync_collector`, and the schedules)."""

from __future__ import annotations

import logging

from services.retriever import retrieval, search, snapshots
from services.retriever.knowledge import KnowledgeBase
from services.retriever.search import Retriever
from services.retriever.settings import RetrieverSettings
from services.retriever.sources import collector, fetcher, planner
from services.retriever.sources.converter import Converter
from services.retriever.sources.scheduler import Scheduler
from shared.web import WebClient
from shared import language, partitions, service
from shared.embeddings import shared_embedder
from shared.node import Node
from shared.sources import Staging

log = logging.getLogger(__name__)
_scheduler: Scheduler | None = None


async def nodes(bus, settings: RetrieverSettings):
    global _scheduler
    kb = KnowledgeBase.configured(settings.knowledge_base, shared_embedder(settings.embeddings)).open()
    published = None
    if settings.snapshots.enabled:
        store = await snapshots.open_store(bus, settings.snapshots.history)
        follower = snapshots.Follower(store, kb, settings.snapshots.poll_s)
        await follower.sync()  # every published site known (fetched when first asked) before the first turn
        follower.start()
        published = follower.publish
    language.load()  # a message's language decides its cross-language expansion (search.py)
    crawl = settings.crawl
    web = WebClient(crawl.user_agent, crawl.outbound, crawl.timeout_s, crawl.max_page_bytes)
    if crawl.schedule_poll_s > 0:
        _scheduler = Scheduler(bus, crawl.schedule_poll_s)
        _scheduler.start()
    converter = Converter(settings.convert)

    async def serve_partitions(owned: frozenset[int], count: int) -> None:
        """Sites of partitions this replica no longer answers are closed now, not when the
        budget would push them out: their new owner opens them."""
        closed = await kb.pool.close_where(lambda site: partitions.partition_of(site, count) not in owned)
        if closed:
            log.info("sites of partitions given up closed", extra={"sites": closed})

    retrieval_node = retrieval.make_node(search.configured(kb, settings), settings.partitions, serve_partitions)
    return [retrieval_node,
            *sync_nodes(kb, web, Staging(bus), published, crawl.concurrency, converter)]


def retriever_nodes(retriever: Retriever | None) -> list[Node]:
    """The retriever's node (also what a replay runs: with no retriever, its output is copied)."""
    return [retrieval.make_node(retriever)]


def sync_nodes(kb: KnowledgeBase, web: WebClient, staging: Staging, published=None,
               fetching: int | None = None, converter: Converter | None = None) -> list[Node]:
    """The knowledge sources' nodes (a replay leaves them out: they fetch and write)."""
    return [planner.make_node(web, kb, converter), fetcher.make_node(web, staging, fetching, converter),
            collector.make_node(kb, staging, published)]


def main() -> None:
    service.main("retriever", RetrieverSettings.from_env, nodes)


if __name__ == "__main__":
    main()
