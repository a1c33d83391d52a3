"""Every node of the five services, made for reruns: the router's trained intent model loaded
once, and for each conversation the nodes over that conversation's LLM client (its recorded
calls, or a live client).

Three nodes are `RECORDED`: they read or change the world outside the conversation
(enrichment: company lookups and Redis; retrieval: a knowledge base that ingestion changes;
lead_notifier: the webhook), so a rerun copies their outputs instead of running them.
`live_retrieval` runs the retriever on this machine's knowledge base for every turn;
`retrieval_for_new` only for turns the recording does not have (a fork's new message). The
knowledge base is the shared Qdrant server when `QDRANT_URL` is set, else a private copy of
`KB_DIR` taken now (the embedded store opens in one process at a time). The services'
settings are read from this process's environment once, when the graph is made.
"""

from __future__ import annotations

import dataclasses

from services.enricher.main import enricher_nodes
from services.enricher.settings import EnricherSettings
from services.responder.main import responder_nodes
from services.responder.settings import ResponderSettings
from services.retriever.main import retriever_nodes
from services.router.main import router_nodes
from services.router.classifiers import IntentClassifier
from services.router.runtime import RouterParts
from services.router.settings import RouterSettings
from shared.llm import LLMClient
from shared.node import Node

RECORDED = frozenset({"enrichment", "retrieval", "lead_notifier"})


class Graph:
    def __init__(self, live_retrieval: bool = False, retrieval_for_new: bool = False):
        self._router, self._enricher = RouterSettings.from_env(), EnricherSettings.from_env()
        self._responder = ResponderSettings.from_env()
        self._parts = RouterParts.build(None, self._router)
        self._retriever = _retriever() if (live_retrieval or retrieval_for_new) else None
        self.recorded = RECORDED - ({"retrieval"} if live_retrieval else set())
        self.live_for_new = frozenset({"retrieval"}) if self._retriever is not None else frozenset()

    def nodes(self, llm: LLMClient) -> list[Node]:
        classifier_llm = llm if llm.configured("classifier") else None
        classifier = IntentClassifier.configured(self._parts.classifier.model, classifier_llm, self._router)
        parts = dataclasses.replace(self._parts, llm=classifier_llm, classifier=classifier)
        profiler_llm = llm if self._enricher.profiler_backend == "llm" and llm.configured("profiler") else None
        return [*router_nodes(parts), *enricher_nodes(None, profiler_llm, self._enricher),
                *retriever_nodes(self._retriever), *responder_nodes(llm, None, self._responder)]


def _retriever():
    """The retriever as its service makes it, on this machine's knowledge base."""
    import shutil
    import tempfile
    from pathlib import Path

    from services.retriever import search
    from services.retriever.knowledge import KnowledgeBase
    from services.retriever.settings import RetrieverSettings
    from shared import language
    from shared.embeddings import shared_embedder

    settings = RetrieverSettings.from_env()
    language.load()
    kb = KnowledgeBase.configured(settings.knowledge_base, shared_embedder(settings.embeddings))
    if not settings.knowledge_base.qdrant_url and kb.root.exists():
        copy = Path(tempfile.mkdtemp(prefix="concierge-replay-kb-")) / "kb"
        shutil.copytree(kb.root, copy, ignore=shutil.ignore_patterns(".lock"))
        kb.root = copy
    return search.configured(kb.open(), settings)
