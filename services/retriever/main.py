"""Retriever service: the `retrieval` node (retrieval.py; the search it runs, search.py)
over the sites' knowledge bases (LightRAG on Qdrant, one workspace per site), kept on the
snapshots ingestion publishes when KB_SNAPSHOTS=bus (snapshots.py)."""

from __future__ import annotations

from services.retriever import rerank, retrieval, snapshots
from services.retriever.knowledge import KnowledgeBase
from services.retriever.search import Retriever, keyword_llm_from_env
from services.retriever.settings import RetrievalSettings
from shared import language, service
from shared.embeddings import shared_embedder
from shared.node import Node


async def nodes(bus):
    settings = RetrievalSettings.from_env()
    kb = KnowledgeBase.from_env(shared_embedder()).open()
    if snapshots.enabled():
        follower = snapshots.Follower(await snapshots.store_from_env(bus), kb)
        await follower.sync()  # every published site loaded before the first turn is taken
        follower.start()
    language.load()  # a message's language decides its cross-language expansion (search.py)
    retriever = Retriever(kb=kb, base=settings, rerankers=rerank.from_env(settings.rerank_timeout_s),
                          llm=keyword_llm_from_env())
    return retriever_nodes(retriever)


def retriever_nodes(retriever: Retriever | None) -> list[Node]:
    """The retriever's node (also what a replay runs: with no retriever, its output is copied)."""
    return [retrieval.make_node(retriever)]


def main() -> None:
    service.main("retriever", nodes)


if __name__ == "__main__":
    main()
