"""Every node of the five services, made for reruns: the router's trained intent model loaded
once, and the nodes made once per set of configured LLM roles, over a client that hands each
call to the LLM client of the rerun in progress (`CURRENT_LLM`: that conversation's recorded
calls, or a live client). Making the nodes is most of what a rerun would cost otherwise
(language models, rule files, HTTP clients), and production makes them once per process too.

Four nodes are `RECORDED`: they read or change the world outside the conversation
(enrichment: company lookups and Redis; retrieval: a knowledge base that ingestion changes;
lead_notifier and handoff_notifier: the webhooks), so a rerun copies their outputs instead of
running them.
`live_retrieval` runs the retriever on this machine's knowledge base for every turn;
`retrieval_for_new` only for turns the recording does not have (a fork's new message). The
knowledge base is the shared Qdrant server when `QDRANT_URL` is set, else a private copy of
`KB_DIR` taken now (the embedded store opens in one process at a time). The services'
settings are read from this process's environment once, when the graph is made.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

import msgspec

from services.enricher.main import enricher_nodes
from services.enricher.settings import EnricherSettings
from services.responder.main import responder_nodes
from services.responder.settings import ResponderSettings
from services.retriever.main import retriever_nodes
from services.router.main import router_nodes
from services.router.classifiers import IntentClassifier
from services.router.runtime import RouterParts
from services.router.settings import RouterSettings
from cli.replay.sandbox import CLOCK_NODES
from shared import language
from shared.config import LLM_ROLES, LLMRoleConfig
from shared.llm import LLMClient
from shared.node import Node

RECORDED = frozenset({"enrichment", "retrieval", "lead_notifier", "handoff_notifier"})
# The LLM client of the rerun in progress (each rerun sets its own; reruns in other tasks keep theirs).
CURRENT_LLM: contextvars.ContextVar[LLMClient] = contextvars.ContextVar("replay_llm")


class _CurrentLLM:
    """What the nodes are made with: every attribute is the current rerun's client's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(CURRENT_LLM.get(), name)


class Graph:
    def __init__(self, live_retrieval: bool = False, retrieval_for_new: bool = False):
        self._router, self._enricher = RouterSettings.from_env(), EnricherSettings.from_env()
        self._responder = ResponderSettings.from_env()
        self._parts = RouterParts.build(None, self._router)
        language.load()  # as the services load it at start: the answer's nodes guess languages with it
        self._retriever, self._snapshots = _retriever() if (live_retrieval or retrieval_for_new) else (None, None)
        self.recorded = RECORDED - ({"retrieval"} if live_retrieval else set())
        self.live_for_new = frozenset({"retrieval"}) if self._retriever is not None else frozenset()
        self._made: dict[tuple[frozenset[str], str], list[Node]] = {}

    async def follow_kb_snapshots(self, bus):
        """With the vectors on a Qdrant server (`KB_SNAPSHOTS=bus`), the rest of the knowledge
        base comes from the snapshots ingestion publishes, as for the retriever service: loaded
        now, then kept up to date. None when there is nothing to follow."""
        from services.retriever import snapshots

        if self._retriever is None or not self._snapshots.enabled:
            return None
        store = await snapshots.open_store(bus, self._snapshots.history)
        follower = snapshots.Follower(store, self._retriever.kb, self._snapshots.poll_s)
        await follower.sync()
        follower.start()
        return follower

    def roles(self) -> dict[str, LLMRoleConfig]:
        """Every LLM role as this deployment's services read them (the profiler's only with
        PROFILER_BACKEND=llm); a role none of them reads has no endpoint."""
        read = {**self._router.llm, **self._enricher.llm, **self._responder.llm}
        return {role: read.get(role) or LLMRoleConfig(role=role, base_url="", api_key="", model="")
                for role in LLM_ROLES}

    def nodes(self, llm: LLMClient, answer_backend: str = "") -> list[Node]:
        """The nodes for a rerun whose LLM client is `llm` (the caller sets `CURRENT_LLM` to
        it): which roles it configures decides how they are made (a local or an LLM
        classifier, a template or a model reply), and so does the answer backend
        (`answer_backend`, "": this process's ANSWER_BACKEND), so nodes are kept per set of
        roles and answer backend."""
        key = (frozenset(role for role in LLM_ROLES if llm.configured(role)), answer_backend)
        if key not in self._made:
            self._made[key] = self._make(llm, answer_backend)
        return self._made[key]

    def _make(self, llm: LLMClient, answer_backend: str) -> list[Node]:
        current: Any = _CurrentLLM()
        classifier_llm = current if llm.configured("classifier") else None
        classifier = IntentClassifier.configured(self._parts.classifier.model, classifier_llm, self._router)
        parts = dataclasses.replace(self._parts, llm=classifier_llm, classifier=classifier)
        profiler_llm = current if llm.configured("profiler") else None  # `roles`: only with PROFILER_BACKEND=llm
        responder = self._responder
        if answer_backend:
            responder = msgspec.structs.replace(
                responder, answer=msgspec.structs.replace(responder.answer, backend=answer_backend))
        nodes = [*router_nodes(parts), *enricher_nodes(None, profiler_llm, self._enricher),
                 *retriever_nodes(self._retriever), *responder_nodes(current, None, responder)]
        return [n for n in nodes if n.name not in CLOCK_NODES]  # their outputs are put back (sandbox.py)


def _retriever():
    """The retriever as its service makes it, on this machine's knowledge base, and its snapshot settings."""
    import shutil
    import tempfile
    from pathlib import Path

    from services.retriever import search
    from services.retriever.knowledge import KnowledgeBase
    from services.retriever.settings import RetrieverSettings
    from shared.embeddings import shared_embedder

    settings = RetrieverSettings.from_env()
    kb = KnowledgeBase.configured(settings.knowledge_base, shared_embedder(settings.embeddings))
    if not settings.knowledge_base.qdrant_url and kb.root.exists():
        copy = Path(tempfile.mkdtemp(prefix="concierge-replay-kb-")) / "kb"
        shutil.copytree(kb.root, copy, ignore=shutil.ignore_patterns(".lock"))
        kb.root = copy
    return search.configured(kb.open(), settings), settings.snapshots
