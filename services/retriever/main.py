"""Retriever service: the `retrieval` node (retrieval.py; the search it runs, search.py)
over the sites' knowledge bases (LightRAG on Qdrant, one workspace per site), kept on the
snapshots ingestion publishes when KB_SNAPSHOTS=bus (snapshots.py)."""

from __future__ import annotations

from services.retriever import retrieval, search, snapshots
from services.retriever.knowledge import KnowledgeBase
from services.retriever.search import Retriever
from services.retriever.settings import RetrieverSettings
from shared import language, service
from shared.embeddings import shared_embedder
from shared.node import Node


async def nodes(bus, settings: RetrieverSettings):
    kb = KnowledgeBase.configured(settings.knowledge_base, shared_embedder(settings.embeddings)).open()
    if settings.snapshots.enabled:
        store = await snapshots.open_store(bus, settings.snapshots.history)
        follower = snapshots.Follower(store, kb, settings.snapshots.poll_s)
        await follower.sync()  # every published site loaded before the first turn is taken
        follower.start()
    language.load()  # a message's language decides its cross-language expansion (search.py)
    return retriever_nodes(search.configured(kb, settings))


def retriever_nodes(retriever: Retriever | None) -> list[Node]:
    """The retriever's node (also what a replay runs: with no retriever, its output is copied)."""
    return [retrieval.make_node(retriever)]


def main() -> None:
    service.main("retriever", RetrieverSettings.from_env, nodes)


if __name__ == "__main__":
    main()
